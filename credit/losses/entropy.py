"""Entropy regulariser."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32, aggregate_loss, check_agg_mode, token_count
from credit.losses.reduction import LossOutput

__all__ = ["entropy_bonus"]


def entropy_bonus(*, entropy: ArrayLike, response_mask: ArrayLike, coef: ArrayLike = 0.0,
                  loss_agg_mode: str = "token-mean",
                  num_tokens_global: ArrayLike | None = None,
                  num_seqs_global: ArrayLike | None = None,
                  norm_constant: ArrayLike | None = None) -> LossOutput:
  """Entropy regulariser: loss = −coef·agg(H), so minimising it raises the entropy.

  agg is `aggregate_loss` with the policy loss's aggregation mode and global counts, so
  the bonus is weighted like the policy loss (and sums over micro-batches like it). verl
  `compute_entropy_loss` + `entropy_coeff` (default 0 in current verl; 0.001 in older
  configs). The gradient flows through `entropy`.

  Args:
    entropy: [B,T] per-token policy entropy (differentiable).
    response_mask: [B,T] bool.
    coef: bonus coefficient (≥ 0 rewards entropy).
    loss_agg_mode: aggregation mode (`AGG_MODES`), static.
    num_tokens_global, num_seqs_global, norm_constant: see `aggregate_loss`.

  Returns:
    LossOutput with metrics `entropy` (token mean of H) and `entropy_agg` (agg(H)).
  """
  check_agg_mode(loss_agg_mode)
  chex.assert_rank([entropy, response_mask], 2)
  chex.assert_equal_shape([entropy, response_mask])
  m_BT = jnp.asarray(response_mask).astype(bool)
  h_BT = jnp.where(m_BT, jnp.asarray(entropy, F32), 0.0)
  h_agg = aggregate_loss(h_BT, m_BT, loss_agg_mode, num_tokens_global=num_tokens_global,
                         num_seqs_global=num_seqs_global, norm_constant=norm_constant)
  metrics = {"entropy": jax.lax.stop_gradient(jnp.sum(h_BT) / token_count(m_BT)),
             "entropy_agg": jax.lax.stop_gradient(h_agg)}
  return LossOutput(-coef * h_agg, metrics)
