"""Dr.GRPO: the group-mean baseline without the std division."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import grpo_scalar
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["dr_grpo_advantages"]

_PAPER = ("Understanding R1-Zero-Like Training: A Critical Perspective (Dr.GRPO), "
          "arXiv 2503.20783")


@register_estimator("dr_grpo", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py "
                            "compute_grpo_outcome_advantage "
                            "(norm_adv_by_std_in_grpo=False)"))
def dr_grpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, group_size: int | None = None,
                       singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Dr.GRPO advantage: the group-mean baseline without the std division.

  Removing the std division removes GRPO's question-difficulty weighting (groups with a
  small reward spread otherwise get large advantages)::

    a_i = R_i − μ_g,   A[i,t] = a_i · M[i,t]

  Paper: "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783,
  §3.2. The paper's second change, a constant loss normaliser instead of the response length, belongs
  to the loss (`loss_agg_mode="seq-mean-token-sum-norm"`), not here. Equal to verl's
  GRPO with `norm_adv_by_std_in_grpo=False`, except that a one-row group gives 0 unless
  `singleton="raw"`.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    singleton: "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = dr_grpo_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
    ...                        response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.asarray(a[:, 0]).tolist()
    [0.5, -0.5, -0.5, 0.5]
  """
  check_choice("dr_grpo_advantages", "singleton", singleton, ops.SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "dr_grpo_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  adv_B = grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, "none", 0.0, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
