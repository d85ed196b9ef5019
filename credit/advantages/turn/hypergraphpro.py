"""HyperGraphPro: progress-based modulation of the GRPO advantage per retrieval turn."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["hypergraphpro_advantages"]

_PAPER = ("HyperGraphPro: Progress-Aware Reinforcement Learning for Structure-Guided Hypergraph "
          "RAG, arXiv 2601.17755")


@register_estimator("hypergraphpro", needs=("reward", "turn_progress", "step_mask", "turn_id",
                                            "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def hypergraphpro_advantages(*, reward: ArrayLike, turn_progress: ArrayLike,
                             step_mask: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                             response_mask: ArrayLike, num_groups: int,
                             alpha: ArrayLike = 1.0, max_factor: ArrayLike = 2.0,
                             eps: float = 1e-6) -> Array:
  """Progress-modulated GRPO advantage per retrieval turn.

  On success, turns that made more verifiable progress than the row's average are
  amplified; on failure they are penalised less::

    A_b = (R_b − μ_g) / (σ_g + eps)
    Δρ[b,k] = p[b,k] − p[b,k⁻]              (k⁻ the previous valid turn; p = 0 before the first)
    f[b,k] = clip(1 + α (Δρ[b,k] − mean_k' Δρ[b,k']) sign(A_b), 0, max_factor)
    A[b,t] = A_b · f[b,k(t)]

  `turn_progress` is the progress after each turn (e.g. the fraction of gold hyperedges
  covered). Policy tokens outside any turn get A_b; tokens of a turn outside `step_mask`
  get 0; A_b = 0 gives 0.

  Paper: "HyperGraphPro: Progress-Aware Reinforcement Learning for Structure-Guided
  Hypergraph RAG", arXiv 2601.17755. The abstract says advantages are modulated by
  intermediate progress; the factor above, α = 1 and the clip [0, 2] are this library's.

  Args:
    reward: [B] outcome.
    turn_progress: [B,K] progress in [0,1] after each turn.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    alpha: modulation strength α.
    max_factor: upper clip of the factor (lower clip 0).
    eps: added to the GRPO std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = hypergraphpro_advantages(reward=np.array([1., 0.]),
    ...     turn_progress=np.array([[.5, .5, .6], [0., 0., 0.]]), step_mask=np.ones((2, 3), bool),
    ...     turn_id=np.array([[0, 1, 2]] * 2), group_id=np.array([0, 0]),
    ...     response_mask=np.ones((2, 3), bool), num_groups=1)
    >>> [round(float(v), 4) for v in a[0]]
    [0.9192, 0.5657, 0.6364]
  """
  rows = ops.group_rows("hypergraphpro_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  p_BK = jnp.asarray(turn_progress, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([p_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  B, K = p_BK.shape
  a_B = ops.turn_normalize(rows.values[:, None], rows.valid[:, None], rows.group_id,
                           num_groups, ddof=1, eps=eps)[:, 0]
  # Progress at the previous valid turn (0 before the first).
  ks = jnp.arange(K, dtype=jnp.int32)
  last_BK = jax.lax.cummax(jnp.where(valid_BK, ks[None, :], -1), axis=1)
  prev_BK = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), last_BK[:, :-1]], axis=1)
  p_BK = jnp.where(valid_BK, p_BK, 0.0)
  p_prev = jnp.where(prev_BK >= 0, jnp.take_along_axis(p_BK, jnp.clip(prev_BK, 0, K - 1), 1),
                     0.0)
  d_BK = jnp.where(valid_BK, p_BK - p_prev, 0.0)
  n_B = jnp.sum(valid_BK, axis=1).astype(jnp.float32)
  mean_B = jnp.sum(d_BK, axis=1) / jnp.maximum(n_B, 1.0)
  f_BK = jnp.clip(1.0 + alpha * (d_BK - mean_B[:, None]) * jnp.sign(a_B)[:, None], 0.0,
                  max_factor)
  in_turn = (tid >= 0) & (tid < K)
  f_BT = jnp.where(in_turn, ops.turn_broadcast(jnp.where(valid_BK, f_BK, 0.0), tid), 1.0)
  return jnp.where(rows.mask, a_B[:, None] * f_BT, 0.0)
