"""credit: JAX-native credit assignment for reinforcement learning of LLMs.

Shape legend used in names throughout the library (`adv_BT`, `reward_NG`, ...):
  B  sequences in a batch (B = N·G when groups are contiguous)
  T  tokens per sequence (prompt + response, right-padded)
  N  prompts;  G  samples per prompt
  K  turns / steps per sequence
  V  vocabulary;  D  model width;  H  heads;  S  cache length

Public API: estimators and policy losses by name (`list_estimators`,
`get_estimator`, `list_policy_losses`, `get_policy_loss`), the rollout contract
(`Rollout`, `validate_fields`), and the primitives in `credit.ops`.
"""
from credit import ops
from credit.contract import (CONTRACT, ContractError, Rollout, contiguous_group_size,
                             validate_fields, validate_rollout)
from credit.registry import (EstimatorSpec, PolicyLossSpec, UnknownNameError, get_estimator,
                             get_policy_loss, list_estimators, list_policy_losses)

__all__ = [
    "CONTRACT", "ContractError", "Rollout", "contiguous_group_size", "validate_fields",
    "validate_rollout", "EstimatorSpec", "PolicyLossSpec", "UnknownNameError",
    "get_estimator", "get_policy_loss", "list_estimators", "list_policy_losses", "ops",
]
