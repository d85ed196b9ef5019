"""OREAL's policy loss (positive NLL + negative policy gradient + k3 KL) and its token-RM loss.

The advantages come from `credit.advantages.shaping.oreal_advantages` (RLOO times the
token reward model's weights w⁺ / w⁻).
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32
from credit.losses.kl import kl_penalty
from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import POLICY_NEEDS, STATIC_ARGNAMES, TokenLoss, _full_loss
from credit.registry import register_policy_loss

__all__ = ["oreal_loss", "oreal_token_rm_loss"]

Array = jax.Array

_NAME = "oreal"
_PAPER = ("Exploring the Limit of Outcome Reward for Learning Mathematical Reasoning (OREAL), "
          "arXiv 2502.06781")


def _count(x: Array, global_value: ArrayLike | None) -> Array:
  local = jnp.maximum(jnp.sum(x, dtype=F32), 1.0)
  return local if global_value is None else jnp.maximum(jnp.asarray(global_value, F32), 1.0)


def oreal_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
               response_mask: ArrayLike, reward: ArrayLike,
               logprob_ref: ArrayLike | None = None, pos_coef: ArrayLike = 1.0,
               neg_coef: ArrayLike = 0.5, kl_coef: ArrayLike = 0.01,
               pos_tokens_global: ArrayLike | None = None,
               neg_tokens_global: ArrayLike | None = None,
               kl_tokens_global: ArrayLike | None = None) -> TokenLoss:
  """OREAL: behaviour cloning on positives, reshaped policy gradient on negatives, k3 KL.

  Confidence: code-verified (InternLM/OREAL `train_oreal.py` loss block; spec
  `shared/methods/outcome_and_clipping.md` §14 and its corrections).

  Paper: "Exploring the Limit of Outcome Reward for Learning Mathematical Reasoning",
  arXiv 2502.06781.

  .. math::
    L = f⁺/N⁺ Σ_{i: R_i>0} Σ_t (−log π)·A
      − f⁻/N⁻ Σ_{i: R_i≤0} Σ_t exp(log π − sg log π)·A
      + β/N Σ_{i,t} k3(π, π_ref)

  A = `oreal_advantages` (a_i·w⁺ on positives, a_i·w⁻ on negatives); N⁺, N⁻, N the
  token counts of the positive rows, the negative rows and all rows. The negative term's
  value is −A (ratio 1), its gradient −A∇log π. The KL covers every row, positives too.
  The per-token term already carries these normalisers, so the full loss's default
  aggregation is "token-sum" (which reproduces L); another `loss_agg_mode` rescales it.
  Without `logprob_ref` the KL term is dropped.

  Args:
    logprob, logprob_old, advantages: [B,T] float32 (`logprob_old` feeds only the shared
      ratio metrics: OREAL's negative term is a ratio to the current policy itself);
      response_mask: [B,T] bool.
    reward: [B] outcome; positives are R > 0.
    logprob_ref: optional [B,T] reference log-probs for the k3 KL.
    pos_coef, neg_coef, kl_coef: f⁺ = 1.0, f⁻ = 0.5, β = 0.01 (code defaults).
    pos_tokens_global, neg_tokens_global, kl_tokens_global: optional N⁺, N⁻, N over the
      whole mini-batch when it is split into micro-batches (then the micro-batch losses
      sum to the mini-batch loss).

  Returns:
    TokenLoss; metrics `pos_frac` (fraction of tokens on positive rows) and `kl`
    (k3 per token, 0 without `logprob_ref`).
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  r_B = jnp.asarray(reward, F32)
  chex.assert_shape(r_B, x.mask.shape[:1])
  pos_BT = x.mask & (r_B > 0)[:, None]
  neg_BT = x.mask & ~pos_BT
  n_pos = _count(pos_BT, pos_tokens_global)
  n_neg = _count(neg_BT, neg_tokens_global)
  n_all = _count(x.mask, kl_tokens_global)
  ratio_self = jnp.exp(x.lp - jax.lax.stop_gradient(x.lp))
  loss = (jnp.where(pos_BT, -x.lp * x.adv * (pos_coef / n_pos), 0.0)
          + jnp.where(neg_BT, -ratio_self * x.adv * (neg_coef / n_neg), 0.0))
  if logprob_ref is None:
    kl_BT = jnp.zeros_like(loss)
  else:
    chex.assert_equal_shape([logprob_ref, x.mask])
    ref = jnp.where(x.mask, jnp.asarray(logprob_ref, F32), 0.0)
    kl_BT = jnp.where(x.mask, kl_penalty(x.lp, ref, "k3"), 0.0)
    loss = loss + kl_BT * (kl_coef / n_all)
  return TokenLoss(loss, {"pos_frac": pos_BT, "kl": kl_BT})


# Registered by hand (not with `policy_loss`) because the loss takes `reward` and
# `logprob_ref` beyond `POLICY_NEEDS`; the full loss is the per-token term + shared reduction.
register_policy_loss(_NAME, needs=POLICY_NEEDS + ("reward", "logprob_ref"), paper=_PAPER,
                     static_argnames=STATIC_ARGNAMES,
                     token_fn=oreal_loss)(_full_loss(_NAME, oreal_loss, "token-sum"))


def oreal_token_rm_loss(*, token_rm_logit: ArrayLike, response_mask: ArrayLike,
                        reward: ArrayLike) -> Array:
  """OREAL's token reward-model objective: BCE of σ(mean_t z_t) against 1[R > 0].

  Confidence: code-verified (InternLM/OREAL `train_oreal.py`: the token RM's label is
  `int(max(R, 0))`).

  .. math::
    ℓ_i = BCE(σ(z̄_i), y_i),   z̄_i = Σ_t M z_t / |o_i|,   y_i = 1[R_i > 0]
    L = mean over the rows with |o_i| > 0

  Args:
    token_rm_logit: [B,T] token RM logits z (differentiated).
    response_mask: [B,T] bool.
    reward: [B] outcome.

  Returns:
    float32 scalar (0 when no row has a token).
  """
  z_BT = jnp.asarray(token_rm_logit, F32)
  m_BT = jnp.asarray(response_mask).astype(bool)
  r_B = jnp.asarray(reward, F32)
  chex.assert_rank([z_BT, m_BT, r_B], [2, 2, 1])
  chex.assert_equal_shape([z_BT, m_BT])
  chex.assert_equal_shape_prefix([z_BT, r_B], 1)
  len_B = jnp.sum(m_BT, axis=-1, dtype=F32)
  rows_B = len_B > 0
  zbar_B = jnp.sum(jnp.where(m_BT, z_BT, 0.0), axis=-1) / jnp.maximum(len_B, 1.0)
  y_B = (r_B > 0).astype(F32)
  # BCE with logits: softplus(z) − y·z (stable for any z).
  bce_B = jax.nn.softplus(zbar_B) - y_B * zbar_B
  return jnp.sum(jnp.where(rows_B, bce_B, 0.0)) / jnp.maximum(jnp.sum(rows_B, dtype=F32), 1.0)
