"""Inputs and per-row statistics shared by the per-token policy losses."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32, LOG_CLAMP, masked_max, masked_min, token_count

Array = jax.Array


class PolicyInputs(NamedTuple):
  """The masked, typed inputs of a per-token loss (0 outside the mask)."""
  lp: Array       # current log-probs (differentiable)
  lp_old: Array   # stop-gradient
  adv: Array      # stop-gradient
  mask: Array     # bool
  n: Array        # max(Σ mask, 1) over the local batch
  delta: Array    # clamp(lp − lp_old, ±20)


def policy_inputs(logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                  response_mask: ArrayLike) -> PolicyInputs:
  """Checks ranks/shapes, zeroes everything outside the mask, stops gradients of data."""
  chex.assert_rank([logprob, logprob_old, advantages, response_mask], 2)
  chex.assert_equal_shape([logprob, logprob_old, advantages, response_mask])
  m_BT = jnp.asarray(response_mask).astype(bool)
  lp = jnp.where(m_BT, jnp.asarray(logprob, F32), 0.0)
  lp_old = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(logprob_old, F32)), 0.0)
  adv = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(advantages, F32)), 0.0)
  delta = jnp.clip(lp - lp_old, -LOG_CLAMP, LOG_CLAMP)
  return PolicyInputs(lp, lp_old, adv, m_BT, token_count(m_BT), delta)


def seq_len(m_BT: Array) -> Array:
  """|o_i| = Σ_t M, [B] float32."""
  return jnp.sum(m_BT, axis=-1, dtype=F32)


def seq_mean(x_BT: Array, m_BT: Array) -> Array:
  """Σ_t M x / max(|o|,1) per row, [B]."""
  return jnp.sum(jnp.where(m_BT, x_BT, 0.0), axis=-1) / jnp.maximum(seq_len(m_BT), 1.0)


def row_metrics(prefix: str, x_B: Array, rows_B: Array) -> dict[str, Array]:
  """{prefix_mean, prefix_max, prefix_min} of a per-row value over the non-empty rows."""
  nr = jnp.maximum(jnp.sum(rows_B, dtype=F32), 1.0)
  return {f"{prefix}_mean": jnp.sum(jnp.where(rows_B, x_B, 0.0)) / nr,
          f"{prefix}_max": masked_max(x_B, rows_B), f"{prefix}_min": masked_min(x_B, rows_B)}


def seq_ratio_metrics(log_s_B: Array, m_BT: Array) -> dict[str, Array]:
  """seq_ratio_mean/max/min of the sequence ratios exp(log s_i) over non-empty rows."""
  s_B = jnp.exp(jnp.clip(log_s_B, -LOG_CLAMP, LOG_CLAMP))
  return row_metrics("seq_ratio", s_B, jnp.any(m_BT, axis=-1))
