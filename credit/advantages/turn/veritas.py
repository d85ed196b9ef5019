"""VERITAS: turn-level faithfulness rewards added to the outcome, group-normalised per turn."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["veritas_advantages"]

_PAPER = ("Beyond Correctness: Rewarding Faithful Reasoning in Retrieval-Augmented Generation "
          "(VERITAS), arXiv 2510.13272")


@register_estimator("veritas", needs=("reward", "step_reward", "step_mask", "turn_id",
                                      "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def veritas_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                       turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, faith_coef: ArrayLike = 1.0,
                       eps: float = 1e-6) -> Array:
  """Turn reward = outcome + λ · faithfulness of the turn, z-scored over the group's turns.

  Reward models score each turn for the faithfulness of its thinking to the retrieved
  information, of its search to its thinking and of its answer to its thinking; the
  caller sums them into `step_reward`::

    r[b,k] = R_b + λ f[b,k]
    A[b,k] = (r[b,k] − μ_g) / (σ_g + eps)      (every valid turn of the prompt group)

  with the unbiased std; fewer than two turns give 0.

  Paper: "Beyond Correctness: Rewarding Faithful Reasoning in Retrieval-Augmented
  Generation" (VERITAS), arXiv 2510.13272. The abstract names the turn-level
  faithfulness rewards; the weights and the advantage form are this library's.

  Args:
    reward: [B] outcome (e.g. exact match).
    step_reward: [B,K] faithfulness score f of turn k.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    faith_coef: λ.
    eps: added to the std.

  Returns:
    [B,T] float32; tokens of turn k get A[b,k], 0 elsewhere.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = veritas_advantages(reward=np.array([1., 0.]), step_reward=np.array([[1., .5],
    ...     [.5, 0.]]), step_mask=np.ones((2, 2), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.0954, 1.0954, 0.5477, 0.5477], [-0.5477, -0.5477, -1.0954, -1.0954]]
  """
  rows = ops.group_rows("veritas_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  f_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([f_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  r_BK = rows.values[:, None] + faith_coef * jnp.where(valid_BK, f_BK, 0.0)
  adv_BK = ops.turn_normalize(r_BK, valid_BK, rows.group_id, num_groups, ddof=1, eps=eps)
  return ops.turn_broadcast(adv_BK, tid, rows.mask)
