"""SIPO on the default arithmetic setting: self-distillation without a teacher model.

Command:
  python -m experiments.run --config experiments/configs/sipo_arithmetic.py --workdir runs/sipo
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: 1.1 s per RL step on a loaded 2-core CPU, 150 steps from the default warm-up.
Score: held-out greedy accuracy 0.889 after 150 steps (mean of seeds 0-2; GRPO 0.924).

The setting is the default one (`settings.arithmetic`). The policy re-scores each of its samples
under two privileged contexts before the prompt (`alt_context_pass`): the gold answer
(`alt_context_pos = "answer {answer}: "`), and the gold answer with a wrong answer the group
produced (`alt_context_neg = "answer {answer}, not {mistake}: "`). SIPO's token advantage
(`credit.advantages.distill.sipo`) is the GRPO advantage plus the clipped difference of the two
log-probs: what the model, shown the answer, finds more likely once it is also shown the
mistake, is pushed down. It gives a signal in all-wrong groups, where GRPO's is zero.

Measured (2 CPU cores, from the same per-seed warm-ups as GRPO's, 150 steps; seeds
0 / 1 / 2): 0.902 / 0.797 / 0.969 (mean 0.889; step 25 mean 0.790), against GRPO's 0.941 / 0.859
/ 0.973 (0.924). The two re-scoring passes cost 0.55 s of a 1.1 s step on a loaded machine.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = settings.arithmetic(a.tiny)
  c.estimator = "sipo"
  c.policy_loss = "ppo_clip"
  c.alt_context_pos = "answer {answer}: "
  c.alt_context_neg = "answer {answer}, not {mistake}: "
  return c
