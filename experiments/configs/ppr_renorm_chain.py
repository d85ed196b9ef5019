"""PPR ReNorm on chained arithmetic: step-judge rewards calibrated by the outcome, z-scored
over every step of the prompt group.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/ppr_renorm_chain.py \\
      --workdir runs/ppr_renorm --config.warm_start_from=runs/chain_warmup/hf_policy \\
      --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests/experiments/shaping_recipes_test.py).
Time: 0.199 s per RL step on an idle 2-core CPU, 100 steps, from the shared chain warm-up.
Score: held-out greedy accuracy 0.904 after 100 steps (mean of seeds 0-2; GRPO 0.902).

The setting is the shared chain setting (`settings.chain_setting`). Steps are the response cut
after each `c.step_delimiters` token (`step_id`); `step_judge` scores each with the task's
`judge_step` (1 right, 0 wrong), the process reward p. `ppr_renorm`: r̃ = p + o − 1 per step (a
step of a failed response never nets a positive reward), z-scored over all valid steps of the
prompt group, each token taking its own step's value (`step_returns=False`).

Paper-vs-code choices (arXiv 2509.25598, which gives no equation for them, so the method is
marked inferred): the p + o − 1 calibration and the pooled
per-group step normalisation are from the abstract's description; per-step values rather
than step returns (the default; `--config.estimator_kwargs.step_returns=True` accumulates
them backwards).

Measured (2-core CPU; from the shared warm-up, seed 0, and two more made the same
way with --config.seed=1|2; 100 steps, held-out greedy accuracy on 256 prompts): seeds
0 / 1 / 2: 0.871 / 0.895 / 0.945 (mean 0.904; means 0.841 / 0.888 at steps 25 / 50); GRPO from
the same warm-ups 0.879 / 0.898 / 0.930 (mean 0.902; 0.857 / 0.888): on par at 100, behind at
step 25 on two seeds (seeds spread ~0.05). 0.199 s per step against GRPO's 0.193 (seed 0, the
same idle machine); step judge and step splits 0.011 s. README "Rewards with structure".
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = chain_setting(common.base_config())
  c.estimator = "ppr_renorm"
  c.max_steps = 3                       # "14," | "9=9": 2 steps (K = 3 leaves room for a third)
  if a.tiny:
    common.apply_tiny(c)
  return c
