"""GRPO: the outcome reward z-scored within its prompt's group."""
from __future__ import annotations

from typing import Literal

import jax
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["grpo_advantages"]

_PAPER = "DeepSeekMath: Pushing the Limits of Mathematical Reasoning (GRPO), arXiv 2402.03300"


@register_estimator("grpo", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "scale", "singleton"))
def grpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, group_size: int | None = None,
                    scale: Literal["group", "batch", "none"] = "group", eps: float = 1e-6,
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GRPO group-relative advantage, broadcast to the response tokens.

  Confidence: code-verified (verl `core_algos.py` `compute_grpo_outcome_advantage`).

  Paper: "DeepSeekMath" (Shao et al.), arXiv 2402.03300, §4.1.2 (outcome supervision);
  `shared/methods/outcome_and_clipping.md` §1.

  .. math::
    a_i = (R_i − μ_g) / (σ_g + ε),   A[i,t] = a_i · M[i,t]

  with μ_g the group mean and σ_g the unbiased (Bessel) group std (torch.std). As in
  verl, ε is added to σ, not to the variance, so all-equal groups give exactly 0.

  `scale`:
    * "group": divide by the group std (GRPO, verl `norm_adv_by_std_in_grpo=True`);
    * "batch": centre per group, divide by the unbiased std of all valid rewards
      in the batch (TRL `GRPOTrainer` `scale_rewards="batch"`, the "group mean,
      batch std" variant; verl has no such switch — TRL uses ε=1e-4 there,
      we keep `eps`);
    * "none": no division (Dr.GRPO, arXiv 2503.20783).

  Deviation: singleton groups give 0 by default (verl: raw reward; use
  `singleton="raw"`); fully masked rows are excluded from the statistics.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group of each row in [0, num_groups); unused when
      `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    scale: "group" | "batch" | "none".
    eps: added to the std.
    singleton: "zero" | "raw" (see the package docstring).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  >>> import numpy as np
  >>> a = grpo_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
  ...                     response_mask=np.ones((4, 2), bool), num_groups=1)
  >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
  [0.866, -0.866, -0.866, 0.866]
  """
  return ops.grpo_token_advantages(
      "grpo_advantages", reward=reward, group_id=group_id, response_mask=response_mask,
      num_groups=num_groups, group_size=group_size, scale=scale, eps=eps, singleton=singleton)
