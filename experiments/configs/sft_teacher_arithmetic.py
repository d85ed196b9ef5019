"""A teacher for the distillation recipes: a larger model trained by supervised learning on
correct demonstrations of the default arithmetic setting, exported to <workdir>/hf_policy.

Commands (the teacher, then a student distilled from it):
  python -m experiments.run --config experiments/configs/sft_teacher_arithmetic.py \\
      --workdir runs/teacher
  python -m experiments.run --config experiments/configs/opd_arithmetic.py --workdir runs/opd \\
      --config.teacher.init_from=runs/teacher/hf_policy
Variants: `:tiny` (2 SFT steps of a 1-layer model; used by tests).
Time: 1008 s of SFT (3000 steps) on a 2-core machine shared with other runs.
Score: held-out greedy accuracy 1.000 (seed 0).

The task is `grpo_arithmetic.py`'s (2-digit `a+b=` / `a-b=`), but the demonstrations are
always correct (`demo_carry_error=0`) and the model is larger than the student (3 layers of
width 192 against 2 of 128). No RL step runs (`steps=0`): the run evaluates the warmed-up model
on the held-out split and exports it with the character tokenizer's identity
(`char_tokenizer.json`), which distillation runs check against their student's tokenizer
before they start.

Measured (seed 0): held-out greedy accuracy 1.000 after 3000 SFT steps (final loss
0.0007), 1008 s of SFT on a 2-core machine shared with other runs.
"""
from experiments.configs import common, settings

SFT_STEPS = 3000


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = settings.arithmetic(a.tiny)
  c.task_kwargs.demo_carry_error = 0.0     # correct demonstrations only
  c.model.hidden_size = 192
  c.model.intermediate_size = 768
  c.model.num_layers = 3
  c.model.num_heads = 6
  c.model.num_kv_heads = 2
  c.model.head_dim = 32
  c.sft_steps = SFT_STEPS
  c.steps = 0
  c.export_hf = True
  if a.tiny:
    c.sft_steps = 2
    c.model.hidden_size = 48
    c.model.intermediate_size = 96
    c.model.num_layers = 1
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 8
  return c
