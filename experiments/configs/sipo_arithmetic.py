"""SIPO on the default arithmetic setting: self-distillation without a teacher model.

Command:
  python -m experiments.run --config experiments/configs/sipo_arithmetic.py --workdir runs/sipo
Variants: `:tiny` (2 steps, seconds; used by tests).

The setting is `grpo_arithmetic.py`'s. The policy re-scores each of its samples under two
privileged contexts before the prompt (`alt_context_pass`): the gold answer
(`alt_context_pos = "answer {answer}: "`), and the gold answer with a wrong answer the group
produced (`alt_context_neg = "answer {answer}, not {mistake}: "`). SIPO's token advantage
(`credit.advantages.distill.sipo`) is the GRPO advantage plus the clipped difference of the
two log-probs: what the model, shown the answer, finds more likely once it is also shown the
mistake, is pushed down. It gives a signal in all-wrong groups, where GRPO's is zero.
"""
from experiments.configs import common, grpo_arithmetic


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = grpo_arithmetic.get_config("tiny" if a.tiny else None)
  c.estimator = "sipo"
  c.policy_loss = "ppo_clip"
  c.alt_context_pos = "answer {answer}: "
  c.alt_context_neg = "answer {answer}, not {mistake}: "
  return c
