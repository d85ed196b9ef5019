"""InT on chained arithmetic: SFT on self-proposed interventions at the first error, then RL.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/int_chain.py --workdir runs/int \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: 0.4-0.7 s per RL step (2 CPU cores shared with other jobs), 100 steps, from each seed's
  chain warm-up.
Score: held-out greedy accuracy 0.862 after 100 steps (mean of seeds 0-2; GRPO 0.902).

The setting is the shared chain setting (`settings.chain_setting`). For the first
`critical.until` = 20 steps (`experiments/producers/critical.py`), each step takes the failed responses,
finds the step of their first wrong token (the task's verifiable running sums stand in for InT's
self-verification against the reference solution), lets the policy propose 4 replacement steps
there, continues each in the plain context, keeps the first whose continuation is correct (the
code's optional filter), and trains on prompt -> prefix + intervention by SFT (no RL loss in
these steps: rl_weight 0). The remaining steps are GRPO from the InT-trained policy (the paper's
InT, then RL).

InT's interventions are written with the reference solution in the prompt:
`--config.critical.context=answer` puts the gold answer in front of the prompt (after
`c.teacher.prefix`). This tiny policy was never trained to read such a prefix and proposes
garbage under it (measured, seed 0: 0.1 verified interventions per step against ~5.5 without
it, and 0.816 held-out accuracy after 100 steps against GRPO's 0.879), so the recipe lets the
policy propose in its own context, as a model that does not follow instructions must.

Measured (2-core CPU shared with other jobs; from each seed's 1500-step warm-up at
0.434 / 0.375 / 0.449, 100 steps): held-out greedy accuracy 0.871 / 0.852 / 0.863 (mean
0.862) against GRPO's 0.879 / 0.898 / 0.930 (0.902) for all 100 steps: the 20 InT steps (3.5-5.6
interventions each) do not pay back the RL steps they take here. README, "Critical steps of
failed responses".
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = chain_setting(common.base_config())
  c.estimator = "grpo"
  c.critical.enabled = True
  c.critical.objective = "sft"
  c.critical.rl_weight = 0.0
  c.critical.until = 20
  if a.tiny:
    common.apply_tiny(c)
    c.critical.max_items = 2
    c.critical.proposals = 2
    c.critical.until = 1                # one InT step, then one GRPO step
  return c
