"""GPG: group-mean baseline with the gradient-bias correction α."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["gpg_advantages"]

_PAPER = ("GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, "
          "arXiv 2504.02546")
_ALPHAS = ("valid_fraction", "nonzero_reward", "one")


@register_estimator("gpg", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "alpha", "scale", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py "
                            "compute_gpg_outcome_advantage"))
def gpg_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                   num_groups: int, group_size: int | None = None,
                   alpha: Literal["valid_fraction", "nonzero_reward", "one"] = "valid_fraction",
                   scale: bool = False, eps: float = 1e-6,
                   singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GPG: group-mean baseline with the gradient-bias correction α.

  Groups whose rewards are all equal carry no gradient but still dilute the batch mean;
  α scales the others back up::

    a_i = α · (R_i − μ_g) / F_norm,   α = B / (B − M_deg)

  with B the valid rows, M_deg those in all-equal groups (singletons included), and
  F_norm = 1 (the paper's best setting) or σ_g + ε with `scale=True`.

  Paper: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
  arXiv 2504.02546, eq. 9-10. `alpha="nonzero_reward"` reproduces verl, which counts
  rows with a non-zero reward instead (the same only for some reward schemes);
  `alpha="one"` turns the correction off. The paper's resampling threshold is a trainer
  decision, not part of the estimator.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    alpha: static, "valid_fraction" | "nonzero_reward" | "one".
    scale: static bool, divide by the group std.
    eps: added to the std.
    singleton: "zero" | "raw" ("raw" gives α·R_i).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = gpg_advantages(reward=np.array([1., 0, 0, 1, 1, 1, 1, 1]),
    ...                    group_id=np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32),
    ...                    response_mask=np.ones((8, 2), bool), num_groups=2)
    >>> np.asarray(a[:, 0]).tolist()  # α = 8 / 4: the second group is all equal
    [1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
  """
  check_choice("gpg_advantages", "alpha", alpha, _ALPHAS)
  check_choice("gpg_advantages", "singleton", singleton, ops.SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "gpg_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=bool(scale),
                              eps=eps, singleton="zero", group_size=group_size)
  n_valid = jnp.sum(valid_B.astype(jnp.float32))
  if alpha == "valid_fraction":
    gmax = ops.group_reduce_rows(reward_B, gid_B, valid_B, num_groups, group_size, "max")
    gmin = ops.group_reduce_rows(reward_B, gid_B, valid_B, num_groups, group_size, "min")
    n_degenerate = jnp.sum((valid_B & (gmax == gmin)).astype(jnp.float32))
    a = n_valid / jnp.maximum(n_valid - n_degenerate, 1.0)
  elif alpha == "nonzero_reward":
    a = n_valid / jnp.maximum(jnp.sum((valid_B & (reward_B != 0)).astype(jnp.float32)), 1.0)
  else:
    a = jnp.float32(1.0)
  adv_B = a * cen_B
  if singleton == "raw":
    n_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
    adv_B = jnp.where(n_B == 1, a * reward_B, adv_B)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
