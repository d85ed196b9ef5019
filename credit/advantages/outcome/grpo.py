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
                    static_argnames=("num_groups", "group_size", "scale", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py "
                            "compute_grpo_outcome_advantage"))
def grpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, group_size: int | None = None,
                    scale: Literal["group", "batch", "none"] = "group", eps: float = 1e-6,
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GRPO group-relative advantage, broadcast to the response tokens.

  Each response's outcome reward is z-scored within its prompt's group::

    a_i = (R_i − μ_g) / (σ_g + ε),   A[i,t] = a_i · M[i,t]

  with μ_g the group mean and σ_g the unbiased (Bessel) group std; ε is added to σ, not
  to the variance, so an all-equal group gives exactly 0.

  Paper: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
  Models", arXiv 2402.03300, §4.1.2 (outcome supervision).

  `scale="batch"` centres per group and divides by the std of the whole batch (TRL's
  "group mean, batch std"); `scale="none"` is Dr.GRPO. Differences from verl: a group with
  one valid row gives 0 (`singleton="raw"` gives verl's raw reward), and rows with no
  response token take no part in any statistic.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group of each row in [0, num_groups); unused when `group_size`
      is set.
    response_mask: [B,T] bool, the policy's tokens.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    scale: "group" | "batch" | "none".
    eps: added to the std.
    singleton: "zero" | "raw", the advantage of a one-row group.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = grpo_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
    ...                     response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [0.866, -0.866, -0.866, 0.866]
  """
  return ops.grpo_token_advantages(
      "grpo_advantages", reward=reward, group_id=group_id, response_mask=response_mask,
      num_groups=num_groups, group_size=group_size, scale=scale, eps=eps, singleton=singleton)
