"""SCOPE on the default arithmetic setting: teacher distillation on failed samples, weighted
MLE on correct ones, both weighted by perplexities normalised inside each prompt group.

Command (after `sft_teacher_arithmetic.py`, as for `opd_arithmetic.py`):
  python -m experiments.run --config experiments/configs/scope_arithmetic.py \\
      --workdir runs/scope --config.teacher.init_from=runs/teacher/hf_policy
Variants: `:tiny` (2 steps; tests give it the teacher of `sft_teacher_arithmetic:tiny`).
Time: not measured yet (the earlier form ran as `opd_arithmetic.py`).
Score: not measured yet with the current defaults; the earlier form reached 0.896 after 150
  steps (mean of seeds 0-2; GRPO 0.924).

The setting is the default one (`settings.arithmetic`). SCOPE
(`credit.advantages.distill.scope`) routes each sample by the verifier: a failed one gets the
teacher log-ratio (ℓ_teacher − ℓ_student) as its token advantage, weighted by how confident the
teacher is on it; a correct one gets a constant advantage (the on-policy gradient of maximum
likelihood), weighted as the authors' code weights it (by the student's confidence;
`--config.estimator_kwargs.student_weight=uncertain` for the paper's description). Other
teacher estimators run here by name
(`--config.estimator=diffgate|hypereyes|sod|sspo|pcsd|verpo|...`).

Measured with the earlier form (student_weight="uncertain", mle_token_scale=False; as
`opd_arithmetic.py`, 150 steps, seeds 0 / 1 / 2): 0.895 / 0.812 / 0.980 (mean 0.896; step 25
mean 0.822), against GRPO's 0.941 / 0.859 / 0.973 (0.924); the code's defaults are not yet
re-measured here.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = settings.distill_arithmetic(a.tiny)
  c.estimator = "scope"
  return c
