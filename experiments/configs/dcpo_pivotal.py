"""DCPO (smooth advantage standardisation + dynamic clipping) on the pivotal-decision task.

Exactly one known response position decides the reward, so the token-credit heatmap shows
where each estimator puts its credit. Exercises a stateful estimator: DCPO's per-prompt
running reward statistics live in the train state and are checkpointed.

Command:
  python -m experiments.run --config experiments/configs/dcpo_pivotal.py --workdir runs/dcpo_piv
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: not measured yet.
Score: not measured yet.
"""
from experiments.configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = common.base_config()
  c.task = "pivotal"
  c.task_kwargs = {"response_len": 6}
  c.estimator = "dcpo"
  c.policy_loss = "dcpo"
  # DCPO's objective sums each response's token terms and averages over the G responses
  # (the paper's 1/G·Σ_i Σ_t form; verl's "seq-mean-token-sum"), not a token mean.
  c.loss_kwargs.loss_agg_mode = "seq-mean-token-sum"
  c.max_new_tokens = 8
  c.num_train_examples = 2000
  c.sft_steps = 300
  c.steps = 100
  c.learning_rate = 3e-4
  if a.tiny:
    common.apply_tiny(c)
  return c
