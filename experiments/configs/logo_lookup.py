"""Memory-R2's LoGo-GRPO on `lookup`: global groups of full episodes plus local groups of
continuations re-rolled from one saved intermediate state.

Command:
  python -m experiments.run --config experiments/configs/logo_lookup.py --workdir runs/logo_lookup
Variants: `:tiny` (2 steps, seconds; used by tests). The GRPO baseline on the same setting:
`--config.estimator=grpo --config.logo.branch_rows=0` (the local rows are refused with an
estimator that reads no parent_id).
Time: 18 s per RL step on 2 CPU cores at load ~12 (GRPO 13 s), 50 steps from the 300-step lookup
  warm-up.
Score: held-out greedy accuracy 0.562 -> 0.977 / 0.984 at steps 25 / 50 (seed 0; GRPO 0.992 /
  1.000).

The setting is `igpo_lookup.py`'s (1-2 hop questions over a per-question knowledge base, an
imperfect demonstrator that answers 2-hop questions after one lookup, 300 warm-up steps, 50 RL
steps of 16 prompts x 8 episodes). Each step, after the 128 episodes, the `logo_rollout`
producer (`credit.envs.branching`) picks `logo.branch_rows` = 8 episodes with at least two
turns, restores each one's environment to its snapshot after a turn k >= 1 (uniform over the
episode's boundaries) and plays `logo.local_size` = 4 continuations from the same token prefix
(prompt, turns < k, their observations; re-prefilled as context): 160 rows per step. The
estimator `logo` (`credit.advantages.turn.logo`) normalises the episodes within their prompt's
group (GRPO) and each parent's 4 continuations among themselves (local_coef λ = 1); a
continuation's loss tokens are its own turns only.

Measured (seed 0, 2-core CPU at load ~12; LoGo and GRPO from the same 300-step
warm-up at held-out greedy accuracy 0.562, `--config.warm_start_from`; held-out greedy accuracy
on 128 questions): LoGo (8 parents x 4 siblings) 0.977 / 0.984 at steps 25 / 50, 18 s per step
(the re-rollouts ~0.9 s); GRPO 0.992 / 1.000, 13 s per step. One seed cannot tell them apart.
"""
import ml_collections

from experiments.configs import common
from experiments.configs.igpo_lookup import lookup_config


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = lookup_config(a)
  c.estimator = "logo"
  c.policy_loss = "ppo_clip"
  c.logo = ml_collections.ConfigDict(dict(branch_rows=2 if a.tiny else 8, local_size=4))
  return c
