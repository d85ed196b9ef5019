"""Pieces shared by several turn estimators (not methods themselves).

IGPO's per-turn rewards — the information gain of each non-final turn and the outcome on the
last turn — are also A2TGPO's, so both estimators build on `igpo_turn_rewards`. The layout
of a multi-turn batch (`turn_layout`, `previous_valid`) is in `credit.ops.turns`.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops._cast import as_f32
from credit.ops.turns import previous_valid

Array = jax.Array

GAINS = ("log_prob_diff", "prob_diff")


def information_gains(gold_logprob_prompt: ArrayLike, gold_logprob_turns: ArrayLike,
                      valid_BK: ArrayLike, *, gain: str = "log_prob_diff",
                      floor: float | None = None) -> Array:
  """Per-turn gain of the gold answer's score over the previous valid turn, [B,K].

  log_prob_diff: g_k − g_{k−1}; prob_diff: exp(g_k) − exp(g_{k−1}), with g the mean per-token
  log-prob of the gold answer (g_0 from the prompt alone). Turns outside `valid_BK` get 0
  and are skipped (the next valid turn compares against the last valid one). `floor`
  clips g from below first (TRACE: −50).
  """
  check_choice("information_gains", "gain", gain, GAINS)
  valid = jnp.asarray(valid_BK, bool)
  g_BK = as_f32(gold_logprob_turns)
  g0_B = as_f32(gold_logprob_prompt)
  chex.assert_rank([g_BK, g0_B], [2, 1])
  chex.assert_equal_shape([g_BK, valid])
  row = jnp.any(valid, axis=1)
  g_BK = jnp.where(valid, g_BK, 0.0)
  g0_B = jnp.where(row, g0_B, 0.0)
  if floor is not None:
    g_BK, g0_B = jnp.maximum(g_BK, floor), jnp.maximum(g0_B, floor)
  if gain == "prob_diff":
    g_BK, g0_B = jnp.exp(jnp.minimum(g_BK, 0.0)), jnp.exp(jnp.minimum(g0_B, 0.0))
  return jnp.where(valid, g_BK - previous_valid(g_BK, valid, g0_B), 0.0)


def igpo_turn_rewards(*, reward: ArrayLike, gold_logprob_turns: ArrayLike,
                      gold_logprob_prompt: ArrayLike, valid_BK: ArrayLike, last_BK: ArrayLike,
                      gain: str = "log_prob_diff") -> tuple[Array, Array]:
  """(ig_BK, outcome_BK): IG on the valid non-final turns, the outcome on the last turn."""
  valid = jnp.asarray(valid_BK, bool)
  last = jnp.asarray(last_BK, bool)
  ig = information_gains(gold_logprob_prompt, gold_logprob_turns, valid, gain=gain)
  reward_B = as_f32(reward)
  chex.assert_rank(reward_B, 1)
  ig = jnp.where(valid & ~last, ig, 0.0)
  out = jnp.where(last, reward_B[:, None], 0.0)
  return ig, out
