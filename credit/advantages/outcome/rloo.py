"""RLOO: the mean reward of the other samples of the prompt is the baseline."""
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

__all__ = ["rloo_advantages"]

_PAPER = ("Back to Basics: Revisiting REINFORCE Style Optimization for RLHF (RLOO), "
          "arXiv 2402.14740")


@register_estimator("rloo", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py "
                            "compute_rloo_outcome_advantage"))
def rloo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, group_size: int | None = None,
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """REINFORCE leave-one-out (RLOO) advantage.

  Each response is compared with the mean reward of the other responses to its prompt::

    a_i = R_i − (S_g − R_i)/(n_g − 1) = n_g/(n_g − 1) · (R_i − μ_g)

  computed in the second form, from the accurately centred reward.

  Paper: "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
  Feedback in LLMs", arXiv 2402.14740, eq. 6. A one-row group gives 0 (verl keeps R_i;
  `singleton="raw"`).

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
    >>> a = rloo_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
    ...                     response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [0.6667, -0.6667, -0.6667, 0.6667]
  """
  check_choice("rloo_advantages", "singleton", singleton, ops.SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "rloo_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)
  n_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  adv_B = cen_B * n_B / jnp.maximum(n_B - 1.0, 1.0)
  adv_B = apply_singleton(adv_B, reward_B, n_B, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
