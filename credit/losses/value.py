"""PPO clipped value loss."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import (F32, aggregate_loss, check_agg_mode, token_count,
                                       token_means)
from credit.losses.reduction import LossOutput

__all__ = ["value_loss"]


def value_loss(*, values: ArrayLike, values_old: ArrayLike, returns: ArrayLike,
               response_mask: ArrayLike, clip_range_value: ArrayLike | None = 0.5,
               loss_agg_mode: str = "token-mean",
               num_tokens_global: ArrayLike | None = None,
               num_seqs_global: ArrayLike | None = None,
               norm_constant: ArrayLike | None = None) -> LossOutput:
  """PPO clipped value loss.

  .. math::
    V^c = clip(V, V_old − c_v, V_old + c_v)
    loss = ½·agg(max((V − R)², (V^c − R)²))

  J. Schulman et al., arXiv 1707.06347 (value clipping as in OpenAI baselines); verified
  against verl `core_algos.py` `compute_value_loss`. Gradients flow only through `values`;
  `values_old` and `returns` are stop-gradient.

  Args:
    values: [B,T] current critic predictions V.
    values_old: [B,T] critic values at rollout time.
    returns: [B,T] targets R (e.g. GAE returns).
    response_mask: [B,T] bool.
    clip_range_value: c_v (verl `cliprange_value` 0.5); None = unclipped ½(V − R)².
    loss_agg_mode: aggregation mode (`AGG_MODES`), static.
    num_tokens_global, num_seqs_global, norm_constant: see `aggregate_loss`.

  Returns:
    LossOutput with metrics `vf_clipfrac`, `vf_mse` (token mean of (V−R)²), `vpred_mean`.
  """
  check_agg_mode(loss_agg_mode)
  chex.assert_rank([values, values_old, returns, response_mask], 2)
  chex.assert_equal_shape([values, values_old, returns, response_mask])
  m_BT = jnp.asarray(response_mask).astype(bool)
  v = jnp.where(m_BT, jnp.asarray(values, F32), 0.0)
  v_old = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(values_old, F32)), 0.0)
  ret = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(returns, F32)), 0.0)
  l1 = jnp.square(v - ret)
  if clip_range_value is None:
    l_BT, clipped = l1, jnp.zeros_like(m_BT)
  else:
    v_clip = jnp.clip(v, v_old - clip_range_value, v_old + clip_range_value)
    l2 = jnp.square(v_clip - ret)
    l_BT, clipped = jnp.maximum(l1, l2), l2 > l1
  loss = 0.5 * aggregate_loss(l_BT, m_BT, loss_agg_mode, num_tokens_global=num_tokens_global,
                              num_seqs_global=num_seqs_global, norm_constant=norm_constant)
  metrics = token_means(m_BT, token_count(m_BT),
                        {"vf_clipfrac": clipped, "vf_mse": l1, "vpred_mean": v})
  return LossOutput(loss, metrics)
