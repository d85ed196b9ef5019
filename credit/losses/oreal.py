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

  ::

    L = f⁺/N⁺ Σ_{i: R_i>0} Σ_t (−log π) A
      − f⁻/N⁻ Σ_{i: R_i≤0} Σ_t exp(log π − sg log π) A
      + β/N Σ_{i,t} k3(π, π_ref)

  with A = `oreal_advantages` and N⁺, N⁻, N the token counts of the positive rows, the
  negative rows and all rows. The negative term's value is −A (ratio 1), its gradient
  −A ∇log π; the KL covers every row. The per-token term carries these normalisers, so the
  default aggregation is "token-sum"; without `logprob_ref` the KL term is dropped.

  Paper: "Exploring the Limit of Outcome Reward for Learning Mathematical Reasoning",
  arXiv 2502.06781; defaults f⁺ = 1, f⁻ = 0.5, β = 0.01 as the authors' code.

  Args:
    logprob: [B,T] float32 current log-probs (differentiated).
    logprob_old: [B,T] float32 (feeds only the shared ratio metrics).
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    reward: [B] outcome; positives are R > 0.
    logprob_ref: optional [B,T] reference log-probs for the k3 KL.
    pos_coef: f⁺.
    neg_coef: f⁻.
    kl_coef: β.
    pos_tokens_global: optional N⁺ over the whole mini-batch (micro-batching).
    neg_tokens_global: optional N⁻ over the whole mini-batch.
    kl_tokens_global: optional N over the whole mini-batch.

  Returns:
    TokenLoss; metrics `pos_frac` (fraction of tokens on positive rows) and `kl`.

  Example:
    >>> import numpy as np
    >>> lp = np.log(np.array([[.5, .5], [.25, .25]]))
    >>> out = oreal_loss(logprob=lp, logprob_old=lp, advantages=np.array([[1., 1.], [-1., -1.]]),
    ...                  response_mask=np.ones((2, 2), bool), reward=np.array([1., -1.]))
    >>> np.round(np.asarray(out.loss, np.float64), 4).tolist()   # summed: 1.1931
    [[0.3466, 0.3466], [0.25, 0.25]]
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
                     confidence="code-verified",
                     source=_PAPER + "; code: InternLM/OREAL train_oreal.py (the loss block)",
                     static_argnames=STATIC_ARGNAMES,
                     token_fn=oreal_loss)(_full_loss(_NAME, oreal_loss, "token-sum"))


def oreal_token_rm_loss(*, token_rm_logit: ArrayLike, response_mask: ArrayLike,
                        reward: ArrayLike) -> Array:
  """OREAL's token reward-model objective: BCE of σ(mean_t z_t) against 1[R > 0].

  ::

    ℓ_i = BCE(σ(z̄_i), y_i),   z̄_i = Σ_t M z_t / L_i,   y_i = 1[R_i > 0]
    L = mean over the rows with L_i > 0

  As the authors' `train_oreal.py` (the label is int(max(R, 0))).

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
