"""C-GRPO on chained arithmetic: the rubric of running sums blended into a correct outcome.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/c_grpo_chain.py --workdir runs/c_grpo \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests/experiments/shaping_recipes_test.py).
Time: 0.194 s per RL step on an idle 2-core CPU, 100 steps, from the shared chain warm-up.
Score: held-out greedy accuracy 0.905 after 100 steps (mean of seeds 0-2; GRPO 0.902).

The setting is the shared chain setting (`settings.chain_setting`) (1-digit operands, running
sums, a demonstrator that forgets carries). The `rubric_check` producer judges the task's rubric
on each response (`credit.tasks.Chain.rubric`: item j is 1 when the reasoning states the running
sum s_{j+2} as its j-th field), so rubric [B,C] plays CaRR's citation rubric. `c_grpo` blends
its mean r into the outcome o ∈ {0, 1} and runs GRPO on the result.

Paper-vs-code choices (THUDM/CaRR): mode
"positive", the released code's (R = o when o = 0, else (1 − α)·o + α·r), with r the
*un-normalised* rubric fraction (the code; the paper describes the group-max-normalised r̂,
`--config.estimator_kwargs.normalize_in_positive=True`); α = 0.3 (the code's
training_run_4b-C-GRPO-rubric0.3.sh). So among right answers a response whose reasoning is
also right (the same answer reached without a slip: "14,9=9" against "=9" or a slipped
field that happens to land on the right answer) ranks higher; wrong answers all get 0.

Measured (2-core CPU; from the shared warm-up, seed 0, and two more made the same
way with --config.seed=1|2; 100 steps, held-out greedy accuracy on 256 prompts): seeds
0 / 1 / 2: 0.871 / 0.895 / 0.949 (mean 0.905; means 0.862 / 0.891 at steps 25 / 50); GRPO from
the same warm-ups 0.879 / 0.898 / 0.930 (mean 0.902; 0.857 / 0.888): on par (seeds spread
~0.05). 0.194 s per step against GRPO's 0.193 (seed 0, the same idle machine); the rubric
producer 0.004 s. README "Rewards with structure".
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = chain_setting(common.base_config())
  c.estimator = "c_grpo"
  c.estimator_kwargs.alpha = 0.3        # the code's run script (rubric0.3)
  c.estimator_kwargs.mode = "positive"  # the code's blend: a rubric bonus on right answers only
  if a.tiny:
    common.apply_tiny(c)
  return c
