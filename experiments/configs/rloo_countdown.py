"""RLOO on countdown (reach a target with given numbers) with a tiny from-scratch policy.

Command:
  python -m experiments.run --config experiments/configs/rloo_countdown.py --workdir runs/rloo_cd
Variants: `:tiny` (2 steps, seconds; used by tests).
Expected: countdown is much harder than arithmetic for a tiny char-level model; use this
recipe to compare estimators (`--config.estimator=grpo|dr_grpo|opo|...`), not for a score.
Time: not measured yet.
Score: not measured yet (a comparison setting, not a target score).
"""
from experiments.configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = common.base_config()
  c.task = "countdown"
  c.task_kwargs = {"num_numbers": 3, "max_number": 20, "max_target": 60}
  c.estimator = "rloo"
  c.policy_loss = "ppo_clip"
  c.max_new_tokens = 12
  c.sft_steps = 800
  c.steps = 150
  c.learning_rate = 3e-4
  if a.tiny:
    common.apply_tiny(c)
  return c
