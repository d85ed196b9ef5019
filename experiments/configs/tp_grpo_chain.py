"""TP-GRPO on chained arithmetic: step values from greedy completions after each step,
incremental step rewards and turning points.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/tp_grpo_chain.py --workdir runs/tp \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: 2.25 s per RL step (two runs at a time on 2 CPU cores), 100 steps from the shared chain
  warm-up.
Score: held-out greedy accuracy 0.875 / 0.930 / 0.879 after 100 steps, seeds 0 / 1 / 2 (GRPO
  0.879 / 0.930 / 0.891).

The setting is the shared chain setting (`settings.chain_setting`). Steps are the running sums
("14," | "9=9", cut after each `c.step_delimiters` token). The `step_completions` producer
completes every response greedily after each of its steps and verifies the completion: V_k, the
value after k steps (the response's own reward after its last step; V_0 the greedy response to
the prompt). TP-GRPO (YunzeTong/TurningPoint-GRPO, the run script's setting) rewards each step
with its increment V_k − V_{k−1}, or, at a turning point (a step that turns the local trend
toward the final outcome), with the aggregated long-term reward R − V_{k−1}; step rewards are
normalised per (prompt, step index) and broadcast to the step's tokens. Costs B·(K−1) + N greedy
rollouts per step (`time_baseline`).

Measured (2-core CPU; from the shared warm-up, seeds 0 / 1 / 2): held-out greedy
accuracy 0.875 / 0.930 / 0.879 after 100 steps (GRPO: 0.879 / 0.930 / 0.891); the completions
cost 0.84 s of a 2.25 s step (two runs at a time). README trees table.
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = chain_setting(common.base_config())
  c.max_steps = 3                       # "14," | "9=9": 2 steps (3 with 4 operands)
  c.estimator = "tp_grpo"
  if a.tiny:
    common.apply_tiny(c)
  return c
