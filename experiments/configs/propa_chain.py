"""PROPA on chained arithmetic: per-node GRPO on log-boosted subtree values of a sampled tree,
with PROPA's interleaved SFT on the step's successful paths (or the demonstration).

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/propa_chain.py --workdir runs/propa \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests), `:nosft` (the RL part alone).
Time: 0.74 s per RL step (`:nosft` 0.53 s), 2 CPU cores shared with other jobs, 100 steps from
  each seed's chain warm-up.
Score: held-out greedy accuracy 0.962 after 100 steps, `:nosft` 0.921 (mean of seeds 0-2; GRPO
  0.902).

The setting is the shared chain setting (`settings.chain_setting`), with `cbpo_chain.py`'s tree:
per prompt 4 roots, 2 branch points by entropy, 2 continuations each (8 rows). `propa` gives
every node's children GRPO advantages on log(1 + 10·Q)/log(11) of their subtree values (the
authors' per-node GRPO). The interleaved SFT (`critical.data=successes`,
`experiments/producers/critical.py`) follows the authors' `create_SFT_train_*_after_grpo.py`
(code-verified: YanbeiJiang/PROPA): after each batch's GRPO, SFT on at most 2 correct leaves per
question (the pair whose lowest common ancestor is closest to the root; here: the shortest
common token prefix), or on the question's ground-truth chain of thought when the tree has no
correct leaf. The code runs the SFT as a separate step (lr 1e-4 against GRPO's 1e-6, LoRA); here
it is added to the same update, L = L_RL + weight·L_SFT with weight 1 (a choice).

Measured (2-core CPU shared with other jobs; from each seed's 1500-step warm-up at
0.434 / 0.375 / 0.449, 100 steps): held-out greedy accuracy 0.953 / 0.961 / 0.973 (mean
0.962); `:nosft` 0.930 / 0.891 / 0.941 (0.921); GRPO with 8 samples 0.879 / 0.898 / 0.930
(0.902). ~62 SFT rows per step, of which ~0.9 demonstrations; 0.74 s per step (`:nosft` 0.53 s).
README, "Critical steps of failed responses (CSO, InT) and PROPA's interleaved SFT".
"""
from experiments.configs import common
from experiments.configs.cbpo_chain import tree_setting
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, nosft=False)
  c = chain_setting(common.base_config())
  c.estimator = "propa"
  c.critical.enabled = not a.nosft
  c.critical.data = "successes"
  c.critical.objective = "sft"
  c.critical.rl_weight = 1.0
  c.critical.weight = 1.0
  return tree_setting(c, tiny=a.tiny)
