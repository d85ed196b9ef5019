"""CSO on chained arithmetic: step-level DPO on verified critical steps of failed responses.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/cso_chain.py --workdir runs/cso \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests), `:rl` (the DPO term added to GRPO's loss
instead of replacing it).
Time: 0.5-0.7 s per RL step (2 CPU cores shared with other jobs), 100 steps, from each seed's
  chain warm-up.
Score: held-out greedy accuracy 0.837 (DPO term alone) and 0.901 (`:rl`) after 100 steps, mean
  of seeds 0-2 (GRPO 0.902).

The setting is the shared chain setting (`settings.chain_setting`) (8 samples per prompt,
1-digit operands, running sums, an imperfect demonstrator that forgets carries). Each step
(`experiments/producers/critical.py`): the failed responses' critical step is the step holding their first
wrong token (the task's verifiable running sums stand in for CSO's PRM), 4 alternative steps are
sampled there from the prefix by the policy itself (CSO's expert is a stronger model;
`critical.context=answer` makes the policy an expert with the gold answer in its prompt), each
is continued by the policy and verified, and up to 8 failed rows with a successful alternative
become DPO pairs (chosen: the alternative step, rejected: the original one, the prefix as
context; β = 0.1, the warm-up policy as reference). By default the update is the DPO loss alone
(the paper's CSO: preference learning on the verified steps only); `:rl` adds it to the GRPO
loss.

Measured (2-core CPU shared with other jobs; from each seed's 1500-step warm-up at
0.434 / 0.375 / 0.449, 100 steps): held-out greedy accuracy 0.898 / 0.770 / 0.844 (mean 0.837)
with the DPO term alone, 0.898 / 0.875 / 0.930 (0.901) with `:rl`; GRPO 0.879 / 0.898 / 0.930
(0.902). 3.5-5.7 verified pairs per step; the pipeline takes 0.03-0.05 s of a 0.5-0.7 s step.
README, "Critical steps of failed responses".
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, rl=False)
  c = chain_setting(common.base_config())
  c.estimator = "grpo"
  c.critical.enabled = True
  c.critical.objective = "dpo"
  c.critical.rl_weight = 1.0 if a.rl else 0.0
  if a.tiny:
    common.apply_tiny(c)
    c.critical.max_items = 2
    c.critical.proposals = 2
  return c
