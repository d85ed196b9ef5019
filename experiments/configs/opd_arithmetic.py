"""On-policy distillation (OPD) on the default arithmetic setting, from a trained teacher.

Commands (train the teacher once, then distil):
  python -m experiments.run --config experiments/configs/sft_teacher_arithmetic.py \\
      --workdir runs/teacher
  python -m experiments.run --config experiments/configs/opd_arithmetic.py --workdir runs/opd \\
      --config.teacher.init_from=runs/teacher/hf_policy
Variants: `:tiny` (2 steps; tests give it the teacher of `sft_teacher_arithmetic:tiny`);
`:self` (no external teacher: the policy scores its own samples with the gold answer in its
prompt, `teacher.context=answer`); `:topk` (the sampled-token advantage plus the top-k
reverse KL to the teacher's distribution, `policy_loss=topk_distill`).

The setting is `grpo_arithmetic.py`'s (the student and its imperfect warm-up are the same), so
OPD and GRPO compare at equal steps. The student samples; the frozen teacher (a larger model,
`sft_teacher_arithmetic.py`) scores every sampled token in one pass (`teacher_pass`), and the
per-token advantage is its log-ratio ℓ_teacher − ℓ_student (`credit.advantages.distill.opd`:
the reverse KL's sampled-token estimate, no discount, no group baseline). The verifier's
reward is reported but not used.
"""
from experiments.configs import common, grpo_arithmetic

TEACHER = "runs/teacher/hf_policy"   # `sft_teacher_arithmetic.py`'s export (README commands)


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, self=False, topk=False)
  c = grpo_arithmetic.get_config("tiny" if a.tiny else None)
  c.estimator = "opd"
  c.policy_loss = "ppo_clip"
  c.teacher.init_from = TEACHER
  if a.self:
    c.teacher.init_from = ""
    c.teacher.context = "answer"
  if a.topk:
    c.policy_loss = "topk_distill"
    c.teacher.top_k = 16
  return c
