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
Time: 85-95 s per 150-step run start to exit on an idle 2-core CPU (0.47-0.55 s per step), after
  the teacher.
Score: held-out greedy accuracy 0.915 after 150 steps (mean of seeds 0-2; GRPO 0.924).

The setting is the default one (`settings.arithmetic`) (the student and its imperfect warm-up
are the same), so OPD and GRPO compare at equal steps. The student samples; the frozen teacher
(a larger model, `sft_teacher_arithmetic.py`) scores every sampled token in one pass
(`teacher_pass`), and the per-token advantage is its log-ratio ℓ_teacher − ℓ_student
(`credit.advantages.distill.opd`: the reverse KL's sampled-token estimate, no discount, no group
baseline). The verifier's reward is reported but not used. Measured (2 CPU cores; RL
from the same per-seed warm-ups as GRPO's via `--config.warm_start_from`, 150 steps; held-out
greedy accuracy, seeds 0 / 1 / 2; the teacher of `sft_teacher_arithmetic.py` at accuracy 1.000):
OPD 0.922 / 0.840 / 0.984 (mean 0.915; step 25 mean 0.832), `:topk` 0.934 / 0.824 / 0.988
(0.915; 0.857), OPD + GRPO (`--config.estimator_kwargs.outcome_coef=1.0`) 0.922 / 0.836 / 0.977
(0.911; 0.867), against GRPO's 0.941 / 0.859 / 0.973 (0.924; 0.850): no gain over GRPO at equal
steps here (see the README). The teacher pass cost 0.12-0.14 s of a 0.47-0.55 s step; 85-95 s
per run, start to exit, on an idle machine.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, self=False, topk=False)
  c = settings.distill_arithmetic(a.tiny)  # teacher: runs/teacher/hf_policy, PPO clip
  c.estimator = "opd"
  if a.self:
    c.teacher.init_from = ""
    c.teacher.context = "answer"
  if a.topk:
    c.policy_loss = "topk_distill"
    c.teacher.top_k = 16
  return c
