"""IGPO on `lookup`, a multi-hop search agent: turn credit from information gain about the gold answer.

Command:
  python -m experiments.run --config experiments/configs/igpo_lookup.py --workdir runs/igpo_lookup
Variants: `:tiny` (2 steps, seconds; used by tests). The GRPO baseline on the same setting:
`--config.estimator=grpo`; TRACE (the gold answer scored by the frozen reference, its
`gold_scorer=auto` default): `--config.estimator=trace`; a progress-based method:
`--config.estimator=procredit` (verified progress = hops revealed).
Time: warm-up ~4 min, then ~8 min per 50-step run (5-16 s per RL step on 2 CPU cores shared by
  four runs).
Score: held-out greedy accuracy 0.562 -> 1.000 at step 50 for IGPO and for GRPO (seed 0).

The setting (`credit.envs.lookup`). Each question is a 1- or 2-hop chain over a hidden knowledge
base of its own ("city of boss of ann?"); the policy reads one fact per turn with
`lookup(ann boss)` (observation "ann boss: bob"), then writes `answer(kim)`. The environment
knows which gold facts each turn revealed, so per-turn progress is exact. The policy is a tiny
from-scratch model: a short supervised warm-up on demonstration episodes (observations are
context, not targets), then RL on the outcome (exact match of the answer). The demonstrator is
imperfect (`task_kwargs.demo_early_answer=0.7`): on 7 of 10 two-hop questions it answers right
after the first lookup, with the intermediate name, the premature answer of a search agent.
Imitating it, the greedy policy answers the 1-hop questions right and the 2-hop ones early;
only the outcome reward can teach it to make the second lookup.

IGPO (`credit.advantages.turn.igpo`) needs `gold_logprob_turns`: after every
turn boundary the runner teacher-forces the gold answer in `c.gold_template` ("answer({answer})",
only the answer's tokens scored) under the behaviour policy (`gold_pass`, one batched pass over
the K+1 prefixes of every episode). A turn that reveals the answer raises its log-probability,
so it earns the largest turn reward; the final turn carries the outcome.

Measured (seed 0, 2 CPU cores shared by four runs; both from the same warm-up via
`--config.warm_start_from`): the 300-step warm-up (~4 min) reaches held-out greedy accuracy
0.562 (the 1-hop questions; the 2-hop ones are answered early, as demonstrated); GRPO 0.992 at
step 25 and 1.000 at step 50, IGPO 0.984 and 1.000 (5-16 s per RL step on the loaded machine,
~45% of IGPO's in the gold pass; ~8 min per 50-step run).
"""
import ml_collections

from experiments.configs import common


def lookup_config(a) -> ml_collections.ConfigDict:
  """The shared multi-turn setting on `lookup` (used by the recipes on this task)."""
  c = common.base_config()
  c.task = "lookup"
  c.task_kwargs = ml_collections.ConfigDict({"min_hops": 1, "max_hops": 2,
                                             "num_distractors": 4,
                                             "demo_early_answer": 0.7})
  c.max_turns = 4                 # 2-3 turns in a correct episode, one spare
  c.max_action_tokens = 18        # "lookup(ann boss)" + eos
  c.max_observation_tokens = 16   # "ann boss: bob"
  c.max_new_tokens = 96           # the episode's budget: actions + observations
  return common.multi_turn_training(c, tiny=a.tiny)


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = lookup_config(a)
  c.estimator = "igpo"
  c.policy_loss = "ppo_clip"
  return c
