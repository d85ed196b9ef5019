"""Token redistribution of a sequence advantage: the shared primitive of the token family.

Token-reweighting estimators (DGPO, EAPO, CSCR, SCAPO, ...) all end the same way: a
sequence advantage Â_b is spread over the response tokens with non-negative weights,

  A[b,t] = Â_b · w[b,t] · M[b,t],

optionally renormalised so that the response keeps its total credit (the "budget"),

  Σ_t M[b,t] w[b,t] = L_b = Σ_t M[b,t]   ⇒   Σ_t A[b,t] = L_b · Â_b.

w ≥ 0 is required (not checked under jit): it keeps the sign of every token's advantage
equal to the verifier's sign. This module is private (not imported as a method by
`credit/_discover.py`); estimators import it explicitly:

  from credit.advantages.token._redistribute import redistribute, mix_with_uniform

Also shared here: `signed_weights` (w = 1 + α·sign(Â_b)·s[b,t], the polarity-aware
modulation of EAPO, Perceval and T-REG). The GRPO Â_b the token estimators start from, with
the group-std convention as a choice, is `credit.ops.sequence_advantage`.

Every function is pure, jit/vmap-safe, returns float32 [B,T] with exact zeros outside
`response_mask`, and never divides by zero (also in gradients): values outside the mask,
even NaN or inf, never reach the output.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops

Array = jax.Array

__all__ = ["redistribute", "normalize_budget", "mix_with_uniform", "signed_weights", "SINGLETONS"]

SINGLETONS = ops.SINGLETONS


def _weights_and_mask(weight_BT: ArrayLike, response_mask: ArrayLike) -> tuple[Array, Array]:
  w_BT = jnp.asarray(weight_BT, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([w_BT, mask_BT], [2, 2])
  chex.assert_equal_shape([w_BT, mask_BT])
  mask_BT = mask_BT.astype(bool)
  return jnp.where(mask_BT, w_BT, 0.0), mask_BT


def normalize_budget(weight_BT: ArrayLike, response_mask: ArrayLike, *,
                     prior: ArrayLike = 0.0) -> Array:
  """Rescales non-negative token weights so that each row sums to its length L_b.

  .. math::
    w̃[b,t] = (L_b · w[b,t] + p) / (Σ_t M[b,t] w[b,t] + p)      on valid tokens

  so Σ_t M w̃ = L_b exactly. With `prior` p = 0 this is L_b · w / Σ w, and a row whose
  weights sum to 0 falls back to uniform weights 1 (the plain sequence advantage). A
  positive p acts as a uniform pseudo-weight of total mass p: rows whose weight mass is
  much smaller than p stay close to uniform, continuously (no jump at Σ w = 0).

  Args:
    weight_BT: [B,T] float weights, ≥ 0 on valid tokens (values outside the mask ignored).
    response_mask: [B,T] bool, the tokens that share the budget.
    prior: scalar ≥ 0 (may be an array, for vmap sweeps).

  Returns:
    [B,T] float32 weights summing to L_b per row; 0 outside the mask.

  >>> import numpy as np
  >>> w = normalize_budget(np.array([[1., 3., 0.], [0., 0., 9.]]),
  ...                      np.array([[1, 1, 1], [1, 1, 0]], bool))
  >>> np.asarray(w).tolist()
  [[0.75, 2.25, 0.0], [1.0, 1.0, 0.0]]
  """
  w_BT, mask_BT = _weights_and_mask(weight_BT, response_mask)
  len_B = ops.sequence_lengths(mask_BT)
  prior = jnp.asarray(prior, jnp.float32)
  num_BT = len_B[:, None] * w_BT + prior
  den_B = jnp.sum(w_BT, axis=-1) + prior
  ok_B = den_B > 0
  safe_B = jnp.where(ok_B, den_B, 1.0)
  out_BT = jnp.where(ok_B[:, None], num_BT / safe_B[:, None], 1.0)
  return jnp.where(mask_BT, out_BT, 0.0)


def redistribute(adv_B: ArrayLike, weight_BT: ArrayLike, response_mask: ArrayLike, *,
                 renormalize: bool) -> Array:
  """Spreads a per-sequence advantage over tokens: A[b,t] = Â_b · w[b,t] · M[b,t].

  With `renormalize=True` the weights are first rescaled by `normalize_budget` (prior 0)
  to sum to L_b over the valid tokens, so Σ_t A[b,t] = L_b · Â_b (the response keeps its
  total credit); a row whose weights sum to 0 falls back to uniform weights 1, i.e. the
  plain broadcast advantage. With `renormalize=False` the weights are used as given
  (e.g. a shrink factor in [0,1], or weights that already sum to L_b).

  Requires w ≥ 0 on valid tokens (not checked: it is a traced value): then
  sign(A[b,t]) = sign(Â_b) wherever w > 0.

  Args:
    adv_B: [B] float sequence advantages.
    weight_BT: [B,T] float non-negative token weights.
    response_mask: [B,T] bool, the policy's tokens.
    renormalize: static bool, keep the budget Σ_t w = L_b.

  Returns:
    [B,T] float32 token advantages, exact zeros outside `response_mask`.

  >>> import numpy as np
  >>> a = redistribute(np.array([2., -1.]), np.array([[1., 3.], [0., 0.]]),
  ...                  np.ones((2, 2), bool), renormalize=True)
  >>> np.asarray(a).tolist()
  [[1.0, 3.0], [-1.0, -1.0]]
  """
  adv_B = jnp.asarray(adv_B, jnp.float32)
  chex.assert_rank(adv_B, 1)
  w_BT, mask_BT = _weights_and_mask(weight_BT, response_mask)
  chex.assert_equal_shape_prefix([adv_B, w_BT], 1)
  if renormalize:
    w_BT = normalize_budget(w_BT, mask_BT)
  return jnp.where(mask_BT, adv_B[:, None] * w_BT, 0.0)


def mix_with_uniform(score_BT: ArrayLike, response_mask: ArrayLike, *, alpha: ArrayLike,
                     prior: ArrayLike = 0.0) -> Array:
  """Budget weights mixed with the uniform ones: w = (1 − α) + α · normalize_budget(s).

  ::

    w[b,t] = (1 − α) + α (L_b s[b,t] + p) / (Σ_t s[b,t] + p)

  For s ≥ 0 and α ∈ [0,1]: w ≥ 1 − α ≥ 0 (sign kept) and Σ_t w = L_b (budget kept);
  α = 0 is uniform (the plain sequence advantage), α = 1 is pure score-proportional
  credit. The prior p enters the numerator too, so the budget holds exactly and Σ s = 0
  gives uniform weights without a special case (DGPO's `weighting="linear"`).

  Args:
    score_BT: [B,T] float scores, ≥ 0 on valid tokens.
    response_mask: [B,T] bool.
    alpha: mixing weight in [0,1] (may be an array).
    prior: uniform pseudo-mass p ≥ 0 (see `normalize_budget`).

  Returns:
    [B,T] float32 weights, 0 outside the mask.

  Example:
    >>> import numpy as np
    >>> w = mix_with_uniform(np.array([[0., 3., 1., 0.]]), np.ones((1, 4), bool), alpha=0.5)
    >>> np.asarray(w).tolist()
    [[0.5, 2.0, 1.0, 0.5]]
  """
  w_BT = normalize_budget(score_BT, response_mask, prior=prior)
  alpha = jnp.asarray(alpha, jnp.float32)
  mask_BT = jnp.asarray(response_mask).astype(bool)
  return jnp.where(mask_BT, (1.0 - alpha) + alpha * w_BT, 0.0)


def signed_weights(adv_B: ArrayLike, score_BT: ArrayLike, response_mask: ArrayLike, *,
                   alpha: ArrayLike, clip: bool = True) -> Array:
  """Polarity-aware token weights w[b,t] = 1 + α · sign(Â_b) · s[b,t] on valid tokens.

  A token with a positive score s gets more credit in a response with Â > 0 and more blame
  in one with Â < 0 (|A| grows); a negative score does the opposite. For |s| ≤ 1 and
  α ∈ [0,1], w ≥ 0 (sign kept); with `clip` (static) w is clipped at 0 otherwise. Â = 0
  gives w = 1. Scores outside the mask are ignored (NaN-safe).

  Args:
    adv_B: [B] float sequence advantages (only their sign is used).
    score_BT: [B,T] float token scores.
    response_mask: [B,T] bool.
    alpha: modulation strength (may be an array).
    clip: static, clip w at 0.

  Returns:
    [B,T] float32 weights, 0 outside the mask.

  >>> import numpy as np
  >>> w = signed_weights(np.array([2., -1., 0.]), np.array([[0.5, -1.], [0.5, -1.], [1., 1.]]),
  ...                    np.ones((3, 2), bool), alpha=0.5)
  >>> np.asarray(w).tolist()
  [[1.25, 0.5], [0.75, 1.5], [1.0, 1.0]]
  """
  adv_B = jnp.asarray(adv_B, jnp.float32)
  chex.assert_rank(adv_B, 1)
  s_BT, mask_BT = _weights_and_mask(score_BT, response_mask)
  chex.assert_equal_shape_prefix([adv_B, s_BT], 1)
  w_BT = 1.0 + jnp.asarray(alpha, jnp.float32) * jnp.sign(adv_B)[:, None] * s_BT
  if clip:
    w_BT = jnp.maximum(w_BT, 0.0)
  return jnp.where(mask_BT, w_BT, 0.0)
