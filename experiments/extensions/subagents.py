"""SPD-RAG's document agents as a second set of trained rows in the runner (`multidoc_agents`).

On a task with sub-agents (`credit.envs.subagents`: `task.subagents`), the run's multi-turn
sampler is an `AgentsMultiTurnSampler`, so every `ask(d, question)` of the coordinator is
answered by the policy itself in a fresh context (document d + the sub-question). The loop's
own rows are the coordinator's episodes (dispatch turns role 0, the synthesis turn role 2);
this module turns the agents' generations into rows of their own:

* layout: M = (max_turns − 1)·(agent calls per turn: D with the task's `fanout` `askall`,
  else 1) slots per episode (an ask on the last turn calls no agent), so
  B·M rows of width P + `task.agent_max_tokens` in the single-turn sampler's layout (prompt,
  then the answer, right-padded); slot m of episode b is its m-th agent call, unused slots
  are empty rows (no response token: no advantage, no loss). Rows of one prompt group are
  contiguous (G·M of them), `group_id` is the episode's;
* fields: `reward` = the episode's outcome (the agent is credited by the final answer), or
  with `c.subagents.reward=document` the agent's own verifiable reward: 1 when its answer
  equals its document's (the oracle's: the fact, or "none"; the step's `agent_correct`),
  or with `c.subagents.reward=document_balanced` that reward class-balanced within each turn
  (`credit.envs.subagents.balanced_document_reward`: a right answer scores 1/k on one of the
  k documents holding the asked fact, 1/(n − k) on one of the n − k without it, so under an
  `askall` the right "none"s of the documents without the fact no longer outweigh the one
  answer that finds it; equal to `document` for a single `ask`),
  `turn_role` 1 and `step_mask` on turn 0 of a used slot, `turn_id` 0 on the answer tokens,
  the sampler's log-probs as recorded at the call (`logprob_sampler`), `logprob_old`
  recomputed in the agent's own context (or the sampler's with
  `logprob_old_source=sampler`), `logprob_ref` when the update has a KL term;
* credit (`c.subagents.credit`): `estimator` runs the run's estimator on the agent rows
  (with `spd_rag`, whose (group, role) pools never mix roles, this equals `spd_rag` on the
  coordinator and agent rows stacked, since the coordinator rows hold roles 0 and 2 only and
  the agent rows role 1); `episode` gives each agent row its episode's mean advantage over
  the episode's policy tokens (GRPO's constant row advantage: one trajectory, one credit, the
  role-blind baseline); `auto` = `estimator` for `spd_rag` or a document reward, else
  `episode` (which ignores the agents' own reward, so the document rewards need
  `estimator`).

Both sets of rows go into one update (`train.make_update` with a second row set, `ROLE`, as
JOLT's two roles): L = L_episodes + w·L_agents (w = `c.subagents.loss_coef`), one gradient per
minibatch.
Metrics: `agent_calls` (per episode), `agent_accuracy` (answers equal to the oracle's),
`agent_response_length`, `agent_adv_mean` / `agent_adv_abs_mean`, and the agents' loss
metrics prefixed `agent_`.

Confidence: inferred (SPD-RAG has no training objective; see credit/envs/subagents.py and
credit/advantages/turn/spd_rag.py). Choices of ours: the fixed M slots, the outcome as the
agents' reward, the `episode` baseline, one loss weight, the class-balanced document
reward.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import credit
from credit import parallel
from credit import tasks as tasks_lib
from credit.envs.subagents import AgentsMultiTurnSampler, balanced_document_reward
from credit.tasks.char_tokenizer import prompt_ids
from experiments import producers, train
from experiments.extensions import estimator_loss
from experiments.extensions.base import Built, Extension, Placed, Step, TurnSampler

SetupError = producers.SetupError

EXTRA = "subagent_rows"     # batch key (runner field) of the agents' update batch
ROWS = "subagent_fields"    # batch key of all their fields (device arrays)
HOST = "subagent_host"      # batch key of their host copies and texts
ROLE = "agents"            # the agent rows' row set in the update batch
CREDITS = ("auto", "estimator", "episode")
REWARDS = ("outcome", "document", "document_balanced")
DOCUMENT_REWARDS = ("document", "document_balanced")  # the agents' own verifiable rewards
# The fields the agent rows have (besides the update's own logprob / entropy).
AGENT_FIELDS = frozenset({"tokens", "response_mask", "group_id", "prompt_id", "reward",
                          "logprob_old", "logprob_sampler", "logprob_ref", "advantages",
                          "obs_mask", "turn_id", "step_mask", "turn_role", "step_reward",
                          "turn_progress"})


def task_of(c: ml_collections.ConfigDict) -> Any:
  try:
    return tasks_lib.get_task(c.task, **dict(c.task_kwargs))
  except (KeyError, TypeError, ValueError):
    return None


def on(c: ml_collections.ConfigDict) -> bool:
  """The run's task has per-document sub-agents (`multidoc_agents`)."""
  return bool(getattr(task_of(c), "subagents", False))


def settings(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`c.subagents` over the defaults (credit auto, loss_coef 1, reward outcome)."""
  out = ml_collections.ConfigDict({"credit": "auto", "loss_coef": 1.0, "reward": "outcome"})
  if c.get("subagents") is not None:
    out.update(dict(c.subagents))
  return out


def credit_mode(c: ml_collections.ConfigDict) -> str:
  s = settings(c)
  if s.credit != "auto":
    return s.credit
  return ("estimator" if c.estimator == "spd_rag" or s.reward in DOCUMENT_REWARDS
          else "episode")


def slots(c: ml_collections.ConfigDict) -> int:
  """M, agent calls an episode can make (an ask on its last turn calls none; an `askall`
  calls every document's agent)."""
  per_turn = int(getattr(task_of(c), "agent_calls_per_turn", 1))
  return max(int(c.max_turns) - 1, 1) * per_turn


def check(c: ml_collections.ConfigDict) -> None:
  """SetupError, before any file is written, for a setting the agent rows cannot run with."""
  if not on(c):
    return
  s = settings(c)
  what = f"task {c.task!r} (document agents)"
  if s.credit not in CREDITS:
    raise SetupError(f"subagents.credit={s.credit!r}; valid: {' | '.join(CREDITS)}")
  if float(s.loss_coef) < 0:
    raise SetupError(f"subagents.loss_coef={s.loss_coef} must be >= 0")
  if s.reward not in REWARDS:
    raise SetupError(f"subagents.reward={s.reward!r}; valid: {' | '.join(REWARDS)}")
  if s.reward in DOCUMENT_REWARDS and credit_mode(c) == "episode":
    raise SetupError(f"subagents.reward={s.reward} is the agents' own reward, which "
                     "subagents.credit=episode ignores; use subagents.credit=estimator (or auto)")
  for bad, why in ((c.async_rollouts, "async_rollouts (the agents sample with the step's "
                                      "parameters inside the rollout)"),
                   (c.amft.enabled, "amft (its update replaces the two-row-set update)"),
                   (c.get("critical") is not None and c.critical.enabled,
                    "critical (its objective is not carried by the two-row-set update)"),
                   (c.obs_ce_coef, "obs_ce_coef (not carried by the two-row-set update)"),
                   (int(c.jolt.teacher_samples) > 0, "jolt.teacher_samples"),
                   (producers.rollout_kind(c) in ("tree", "slate"), "tree / slate sampling")):
    if bad:
      raise SetupError(f"{what}: {why} is not built with document agents; turn it off")
  est = credit.get_estimator(c.estimator)
  if estimator_loss.coef(c, est):
    raise SetupError(f"estimator {est.name!r} adds a loss term over the episodes' rows "
                     "(estimator_loss_coef); sub-agent rows have no targets for it: set "
                     "estimator_loss_coef=0 or run without subagents")
  loss = credit.get_policy_loss(c.policy_loss)
  need = (set(loss.needs) - train.UPDATE_FIELDS) | ({"logprob_sampler"}
                                                    if c.importance_correction else set())
  missing = sorted(need - AGENT_FIELDS)
  if missing:
    raise SetupError(f"{what}: policy loss {c.policy_loss!r} needs {missing} on every row, "
                     f"which the agent rows do not have ({sorted(AGENT_FIELDS)})")
  if credit_mode(c) == "estimator":
    est = credit.get_estimator(c.estimator)
    missing = sorted(set(est.needs) - AGENT_FIELDS)
    if missing or est.stateful:
      raise SetupError(f"{what}: subagents.credit=estimator runs {c.estimator!r} on the agent "
                       f"rows, which lack {missing or 'a per-example state'}; use "
                       "subagents.credit=episode")


def check_rows(c: ml_collections.ConfigDict, *, data: Any = None, batch_divisor: int) -> None:
  """The agents' B·M rows split into the update's minibatches on the mesh."""
  del data
  if not on(c):
    return
  rows = c.prompts_per_step * c.group_size * slots(c)
  if rows % (c.num_minibatches * batch_divisor):
    raise SetupError(f"the agent rows (prompts_per_step*group_size*slots={rows}) must "
                     f"be divisible by num_minibatches ({c.num_minibatches}) x the mesh's "
                     f"batch-parallel size ({batch_divisor})")


def sampler_kwargs(task) -> dict:
  """Extra arguments of the run's multi-turn sampler: `agent_max_tokens` (a task with agents)."""
  return {"agent_max_tokens": int(task.agent_max_tokens)}


def agent_prompt_width(task, tokenizer) -> int:
  """Prompt tokens of the longest agent prompt (`task.max_agent_prompt_chars`; exact for the
  character tokenizer), which the run's turn layout widens its prompt columns to."""
  return len(prompt_ids(tokenizer, "x" * int(task.max_agent_prompt_chars)))


def agent_rows(trajectories, reward_B: np.ndarray, group_id_B: np.ndarray, *, slots_M: int,
               width: int, num_turns: int, pad_id: int,
               reward_source: str = "outcome") -> dict[str, Any]:
  """Host arrays of the agents' B·M rows from the episodes' step infos (`agent_call`, one
  record or, after an `askall`, a list of them with `agent_correct` and `agent_holds` lists
  alike): tokens, prompt_mask, response_mask, logprob_sampler, logprob_raw [B·M, width];
  reward, group_id, episode [B·M]; step_mask, turn_role [B·M, K]; turn_id [B·M, width];
  answers (text or None per row) and agent_correct (bool per row). `reward` is the episode's
  outcome (`reward_source="outcome"`), the row's `agent_correct` as 0/1 (`"document"`), or
  `balanced_document_reward` over the calls of the row's turn (`"document_balanced"`); 0 on
  an unused slot under the latter two."""
  B, M = len(trajectories), slots_M
  n = B * M
  out = {"tokens": np.full((n, width), pad_id, np.int32),
         "prompt_mask": np.zeros((n, width), bool), "response_mask": np.zeros((n, width), bool),
         "logprob_sampler": np.zeros((n, width), np.float32),
         "logprob_raw": np.zeros((n, width), np.float32)}
  if reward_source not in REWARDS:
    raise ValueError(f"reward_source={reward_source!r} is not one of {REWARDS}")
  answers: list[str | None] = [None] * n
  correct = np.zeros(n, bool)
  balanced = np.zeros(n, np.float32)
  for b, traj in enumerate(trajectories):
    m = 0
    for res in traj.results:
      recs, oks = res.info.get("agent_call"), res.info.get("agent_correct")
      if recs is None:
        continue
      holds = res.info.get("agent_holds")
      if not isinstance(recs, (list, tuple)):  # one ask: one record
        recs, oks, holds = [recs], [oks], [holds]
      if reward_source == "document_balanced":
        if holds is None or any(h is None for h in holds):
          raise ValueError("reward_source='document_balanced' needs the step info's "
                           "agent_holds; use an environment that records it")
        turn = balanced_document_reward(correct=[bool(ok) for ok in oks],
                                        holds=[bool(h) for h in holds])
      for j, (rec, ok) in enumerate(zip(recs, oks)):
        if m >= M:
          raise AssertionError(f"episode {b} made more than {M} agent calls")
        i = b * M + m
        for k in ("tokens", "prompt_mask", "response_mask", "logprob_sampler", "logprob_raw"):
          out[k][i] = rec[k]
        answers[i], correct[i] = rec["answer"], bool(ok)
        if reward_source == "document_balanced":
          balanced[i] = turn[j]
        m += 1
  resp = out["response_mask"]
  used = resp.any(1)
  out["logprob_sampler"] = np.where(resp, out["logprob_sampler"], 0.0).astype(np.float32)
  out["logprob_raw"] = np.where(resp, out["logprob_raw"], 0.0).astype(np.float32)
  step_mask = np.zeros((n, num_turns), bool)
  step_mask[:, 0] = used
  reward = {"outcome": lambda: np.repeat(np.asarray(reward_B, np.float32), M),
            "document": lambda: correct.astype(np.float32),
            "document_balanced": lambda: balanced}[reward_source]()
  return dict(out, reward=reward,
              group_id=np.repeat(np.asarray(group_id_B, np.int32), M),
              episode=np.repeat(np.arange(B, dtype=np.int32), M), step_mask=step_mask,
              turn_role=np.where(step_mask, 1, 0).astype(np.int32),
              turn_id=np.where(resp, 0, -1).astype(np.int32), answers=answers,
              agent_correct=correct)


def episode_advantages(adv_BT, resp_BT, episode_R, resp_RT):
  """Each agent row's advantage: its episode's mean advantage over the episode's policy
  tokens, on the agent row's response tokens (0 elsewhere)."""
  per_B = credit.ops.masked_mean(adv_BT, resp_BT, axis=1)
  return jnp.where(resp_RT, per_B[episode_R][:, None], 0.0)


def _stats(adv, mask) -> dict:
  return {"adv_mean": credit.ops.masked_mean(adv, mask),
          "adv_abs_mean": credit.ops.masked_mean(jnp.abs(adv), mask)}


def build_stage(s: producers.Setup, update_fields: tuple[str, ...]) -> producers.Stage:
  """The agent rows' stage, after the rollout: rows from the batch's `trajectories`, their
  old (and reference) log-probs and, with credit `estimator`, their advantages; the update
  batch goes to the batch under `EXTRA` (see the module docstring). No contract field."""
  c, task, mesh, tok = s.c, s.data.task, s.mesh, s.data.tokenizer
  N, G, M, K = s.num_groups, s.group_size, slots(c), int(c.max_turns)
  width = s.multi_sampler.layout.prompt_width + int(task.agent_max_tokens)
  mode, reward_source = credit_mode(c), str(settings(c).reward)
  score = s.scorer(entropy=False)
  recompute = c.logprob_old_source != "sampler"
  wanted = tuple(f for f in update_fields if f not in ("tokens", "advantages"))
  adv_fn = est_fields = None
  if mode == "estimator":
    est = credit.get_estimator(c.estimator)
    est_fields, est_static = est.split_arguments(dict(c.estimator_kwargs), num_groups=N,
                                                 group_size=G * M)
    adv_fn = jax.jit(train.make_advantage_fn(est, est_static))

  @jax.jit
  def own_context(params, tokens, attn, response_mask):
    logprob, _ = score(params, tokens, attn)
    return jnp.where(response_mask, logprob, 0.0)

  def produce(state, batch, ctx: producers.StepContext) -> dict:
    host = agent_rows(batch["trajectories"], parallel.to_host(batch["reward"]),
                      batch["host"]["group_id"], slots_M=M, width=width, num_turns=K,
                      pad_id=tok.pad_id, reward_source=reward_source)
    resp = host["response_mask"]
    attn = parallel.shard_batch(host["prompt_mask"] | resp, mesh)
    prompt_id = np.asarray(ctx.examples["index"], np.int32)[host["group_id"]]
    rows = parallel.shard_batch({
        "tokens": host["tokens"], "response_mask": resp, "group_id": host["group_id"],
        "prompt_id": prompt_id, "reward": host["reward"], "obs_mask": np.zeros_like(resp),
        "turn_id": host["turn_id"], "step_mask": host["step_mask"],
        "turn_role": host["turn_role"],
        "step_reward": np.zeros(host["step_mask"].shape, np.float32),
        "turn_progress": np.zeros(host["step_mask"].shape, np.float32),
        "logprob_sampler": host["logprob_sampler"], "logprob_raw": host["logprob_raw"]}, mesh)
    raw = rows.pop("logprob_raw")
    rows["logprob_old"] = (own_context(state.params, rows["tokens"], attn, rows["response_mask"])
                           if recompute else raw)
    if "logprob_ref" in wanted:
      rows["logprob_ref"], _ = score(ctx.ref_params, rows["tokens"], attn)
    if adv_fn is not None:
      rows["advantages"], _, _ = adv_fn({f: rows[f] for f in est_fields}, None)
    rows["attn_mask"] = attn
    used = resp.any(1)
    ctx.metrics.update(
        agent_calls=float(used.sum()) / max(len(batch["trajectories"]), 1),
        agent_accuracy=float(host["agent_correct"][used].mean()) if used.any() else 0.0,
        agent_response_length=float(resp.sum(1)[used].mean()) if used.any() else 0.0)
    return {HOST: host, ROWS: rows}

  return producers.Stage("subagent_rows", "scoring", frozenset(), produce)


def update_batch(parts: dict, step: Step, *, update_fields: tuple[str, ...],
                 num_groups: int) -> dict:
  """`parts` (the update batch, the episodes' rows under `train.MAIN`) with the agent rows'
  under `ROLE`, their advantages made here under credit `episode` (from the episodes'
  `batch["advantages"]`); with `step.validate` the agent rows are checked against
  `credit.CONTRACT` first."""
  batch, ctx = step.batch, step.ctx
  rows, host = dict(batch[ROWS]), batch[HOST]
  if "advantages" not in rows:  # credit episode
    rows["advantages"] = episode_advantages(batch["advantages"], batch["response_mask"],
                                            jnp.asarray(host["episode"]),
                                            rows["response_mask"])
  if step.validate and host["response_mask"].any():  # none: no call this step
    fields = parallel.to_host({k: v for k, v in rows.items() if k in credit.CONTRACT})
    credit.validate_fields(fields, num_groups=num_groups, where="document-agent rows")
  m = _stats(rows["advantages"], rows["response_mask"])
  ctx.metrics.update(agent_adv_mean=float(m["adv_mean"]),
                     agent_adv_abs_mean=float(m["adv_abs_mean"]))
  agents = dict({f: rows[f] for f in update_fields}, attn_mask=rows["attn_mask"])
  return dict(parts, **{ROLE: agents})


def row_sets(c: ml_collections.ConfigDict) -> tuple[train.RowSet, ...]:
  """The agent rows: weight `c.subagents.loss_coef`, metrics prefixed `agent_`, loss
  `loss_agents`, groups of G·M rows (for whole-group losses)."""
  if not on(c):
    return ()
  return (train.RowSet(ROLE, weight=float(settings(c).loss_coef),
                       group_size=c.group_size * slots(c), metric_prefix="agent_",
                       loss_metric="loss_agents"),)


def turn_sampler(data) -> TurnSampler:
  """The policy answers the coordinator's asks as document agents (`AgentsMultiTurnSampler`);
  the turn layout's prompt columns hold the longest agent prompt."""
  return TurnSampler(AgentsMultiTurnSampler, sampler_kwargs(data.task),
                     agent_prompt_width(data.task, data.tokenizer))


def build(s: producers.Setup, method: Any) -> Built:
  """The agent rows' stage after the rollout's producers; the rows join the update."""
  fields, n = method.update_fields, s.c.prompts_per_step
  return Built(stages=(Placed(build_stage(s, fields)),),
               rows=lambda parts, step: update_batch(parts, step, update_fields=fields,
                                                     num_groups=n))


EXTENSION = Extension(
    name="subagents", on=on, check=check, check_run=check_rows, row_sets=row_sets,
    main_role="episodes", build=build, turn_sampler=turn_sampler,
    doc="SPD-RAG's document agents: the policy's answers to the coordinator's asks as rows "
        "of their own, trained with the episodes' rows in one update")
