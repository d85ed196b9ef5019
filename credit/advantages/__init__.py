"""Advantage estimators: rollout fields in, token advantages [B,T] out.

One module per family; importing this package registers every estimator in
`credit.registry` (so `credit.get_estimator(name)` finds it).
"""
from credit.advantages import outcome  # noqa: F401  (registers the outcome family)
from credit.advantages.outcome import (DCPOOutput, DCPOState, GAEOutput, dapo_advantages,
                                       dapo_keep_mask, dapo_overlong_penalty, dcpo_advantages,
                                       dcpo_init_state, dr_grpo_advantages, gae_advantages,
                                       gdpo_advantages, gpg_advantages, grpo_advantages,
                                       grpo_passk_advantages, opo_advantages,
                                       optimal_token_baseline_advantages, reinforce_pp_advantages,
                                       reinforce_pp_baseline_advantages, remax_advantages,
                                       rloo_advantages)

__all__ = [
    "outcome", "DCPOOutput", "DCPOState", "GAEOutput", "dapo_advantages", "dapo_keep_mask",
    "dapo_overlong_penalty", "dcpo_advantages", "dcpo_init_state", "dr_grpo_advantages",
    "gae_advantages", "gdpo_advantages", "gpg_advantages", "grpo_advantages",
    "grpo_passk_advantages", "opo_advantages", "optimal_token_baseline_advantages",
    "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "remax_advantages",
    "rloo_advantages",
]
