"""OPO: the length-weighted mean reward of the group is the baseline."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import apply_singleton
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["opo_advantages"]

_PAPER = "On-Policy RL with Optimal Reward Baseline (OPO), arXiv 2505.23585"


@register_estimator("opo", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py "
                            "compute_opo_outcome_advantage"))
def opo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                   num_groups: int, group_size: int | None = None,
                   singleton: Literal["zero", "raw"] = "zero") -> Array:
  """OPO: the length-weighted mean reward of the group is the baseline.

  The variance-optimal baseline when the gradient norm grows with the response length::

    b_g = Σ_{j∈g} L_j R_j / Σ_{j∈g} L_j,   a_i = R_i − b_g

  with L_j the number of response tokens of row j; computed as
  (R_i − μ_g) − Σ L (R − μ_g) / Σ L to avoid cancellation for large rewards.

  Paper: "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585, eq. 5. A one-row
  group gives 0 (verl: R_i; `singleton="raw"`).

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool; its row sums are the lengths L.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    singleton: "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> m = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], bool)
    >>> a = opo_advantages(reward=np.array([1., 0.]), group_id=np.zeros(2, np.int32),
    ...                    response_mask=m, num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.2, 0.2, 0.2, 0.2], [-0.8, 0.0, 0.0, 0.0]]
  """
  check_choice("opo_advantages", "singleton", singleton, ops.SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "opo_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)
  len_B = jnp.where(valid_B, ops.sequence_lengths(mask_BT), 0.0)
  num_B = ops.group_reduce_rows(len_B * cen_B, gid_B, valid_B, num_groups, group_size, "sum")
  den_B = ops.group_reduce_rows(len_B, gid_B, valid_B, num_groups, group_size, "sum")
  adv_B = cen_B - ops.safe_div(num_B, den_B)
  n_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  adv_B = apply_singleton(adv_B, reward_B, n_B, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
