"""Field producers: how the runner makes the contract fields a method needs.

A producer is declared next to its build function with `base.producer(name, provides=...,
requires=..., phase=..., doc=..., when=...)`. The build runs at setup time (jitting what it
needs once) and returns the per-step callable::

    produce(state, batch, ctx) -> {field: array}   # new fields; `wanted` ⊆ its result

The modules, one kind of producer each:

* `rollouts`: the step's rows. The rollout kind is one config key, `c.rollout` (plain, tree,
  slate, env, logo; 'auto' picks the kind whose switch is on), looked up in `ROLLOUT_KINDS`;
  each kind owns its producer and its row count.
* `passes`: the policy's own pass, the frozen reference, divergences, sampler log-probs, the
  greedy baseline. `teachers`: a frozen teacher, the policy as its own teacher, VERPO's
  evidence pass. `likelihood`: teacher-forced gold answers and follow-ups. `rescoring`: the
  response re-scored under other contexts.
* `signals`: what the task says about each response (reward, steps, judges, rubrics, ...).
* `learners`, `verifier`, `critical`: producers that train their own model next to the
  policy (implicit PRMs, critics, the generative verifier) or build a batch for the update
  (CSO / InT's critical steps).
* `planner`: `plan(needed, c)` picks the enabled producers of the needed fields and orders
  them by dependency; a field that nothing enabled makes is refused at setup.

A new kind of input is a new declaration in one of these modules, never a branch in the step.
"""
from experiments.producers import (base, rollouts, passes, teachers, likelihood, rescoring,
                                   verifier, critical, signals, learners, planner)
from experiments.producers.base import (RUNNER_INPUTS, MissingFieldsError, Produce, Producer,
                                        examples_rows, prompt_width, task_has, verify_rows,
                                        Setup, SetupError, StepContext, delimiter_ids,
                                        from_rollout, is_multi_turn, producer, register,
                                        scoring_temperature, truncated_sampling,
                                        response_starts, step_splitter, table, to_rollout)
from experiments.producers.likelihood import ANSWER_SEQUENCE, append_answer, gold_scorer
from experiments.producers.passes import DIVERGENCE_FIELDS, LOGPROB_OLD_SOURCES
from experiments.producers.planner import Planned, Stage, plan, providers
from experiments.producers.rescoring import ALT_CONTEXTS, response_layout
from experiments.producers.rollouts import (ROLLOUT_KINDS, RolloutKind, env_limits,
                                            first_error_scores, first_wrong_columns,
                                            rollout_kind, rollout_rows, transcript, tree_batch,
                                            turns_are_steps)
from experiments.producers.signals import judged_steps, last_number, stable_hash31
from experiments.producers.teachers import (CHAR_TOKENIZER_FILE, TEACHER_FIELDS,
                                            check_context, check_teacher_files,
                                            privileged_prompt, tokenizer_identity)

PRODUCERS: tuple[Producer, ...] = table()
