"""SCRL on chained arithmetic: one verifiable subproblem per running sum, normalised per
subproblem across the group and placed on that subproblem's answer span.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/scrl_chain.py --workdir runs/scrl \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: not recorded as a whole; the subproblems producer adds 0.08 s per RL step. 100 steps from
  the shared chain warm-up.
Score: held-out greedy accuracy 0.900 after 100 steps (mean of seeds 0-2; GRPO 0.900).

The setting is the shared chain setting (`settings.chain_setting`) (1-digit operands, running
sums, an imperfect demonstrator forgetting carries with probability 0.7). A chain of n operands
is n − 1 subproblems (`credit.tasks.Chain.subproblems`): the running sums s_2 … s_{n−1}, each
the answer of its comma-separated field, and the original problem, answered after the marker
(its span also holds the reasoning's last field, which computes the same sum). The `subproblems`
producer verifies each and maps the answer spans to tokens (`span_id`); `scrl` z-scores each
subproblem's 0/1 result within the group and gives every token the advantage of its span
(`fill="next"`: a token outside any span takes the next span's). A slip in the first running sum
is then penalised on that field even when the answer is right, which the outcome reward cannot
do.

Measured (2-core CPU; from the shared warm-up, seeds 0 / 1 / 2): held-out greedy
accuracy 0.879 / 0.922 / 0.898 after 100 steps (mean 0.900; GRPO 0.879 / 0.930 / 0.891, mean
0.900): on par. The subproblems producer costs 0.08 s per step. README "Rewards with
structure".
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = chain_setting(common.base_config())
  c.estimator = "scrl"
  if a.tiny:
    common.apply_tiny(c)
  return c
