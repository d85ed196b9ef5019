"""River: outcome reward augmented with process-level behaviour regularisation (GRPO)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["river_advantages"]

_PAPER = "Learning Generalizable Behaviors for Terminal Agents (River), arXiv preprint"


@register_estimator("river", needs=("reward", "step_reward", "step_mask", "group_id",
                                    "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def river_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                     group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                     behavior_coef: ArrayLike = 0.1, eps: float = 1e-6) -> Array:
  """GRPO on the outcome plus a mean per-turn behaviour score (trajectory-level credit).

  River augments outcome rewards with process-level behaviour regularisation, read here
  as a per-turn behaviour score b (e.g. +1 inspect / verify, −1 a forbidden or repeated
  command) in `step_reward`, averaged over the turns and added to the outcome::

    R̃_b = R_b + λ mean_{k valid} b[b,k],      A_b = (R̃_b − μ_g) / (σ_g + eps)

  Every policy token of the row gets A_b (unbiased std; a row without valid turns adds
  nothing; one-row groups give 0). River's other part, filtering low-quality environments,
  is data selection before sampling.

  Paper: "Learning Generalizable Behaviors for Terminal Agents" (River, arXiv preprint).
  The form above and λ = 0.1 (a regulariser should not outweigh the outcome) are this
  library's reading of the abstract.

  Args:
    reward: [B] outcome.
    step_reward: [B,K] behaviour score of each turn.
    step_mask: [B,K] bool.
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    behavior_coef: λ.
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = river_advantages(reward=np.array([1., 0.]), step_reward=np.array([[1., 1.],
    ...     [-1., 1.]]), step_mask=np.ones((2, 2), bool), group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [0.7071, -0.7071]
  """
  rows = ops.group_rows("river_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  s_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  chex.assert_equal_shape([s_BK, valid_BK])
  n_B = jnp.sum(valid_BK, axis=1).astype(jnp.float32)
  mean_B = jnp.sum(jnp.where(valid_BK, s_BK, 0.0), axis=1) / jnp.maximum(n_B, 1.0)
  shaped_B = rows.values + behavior_coef * mean_B
  adv_B = ops.turn_normalize(shaped_B[:, None], rows.valid[:, None], rows.group_id, num_groups,
                             ddof=1, eps=eps)[:, 0]
  return ops.broadcast_to_tokens(adv_B, rows.mask)
