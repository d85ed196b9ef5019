"""GMPO: geometric mean of token ratios, clipped per token in log space."""
from __future__ import annotations

import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs, seq_mean, seq_ratio_metrics
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["gmpo_loss"]


@policy_loss("gmpo", "GMPO: Geometric-Mean Policy Optimization, arXiv 2507.20673",
             loss_agg_mode="seq-mean-token-mean")
def gmpo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
              response_mask: ArrayLike, clip_low: ArrayLike = 0.4,
              clip_high: ArrayLike = 0.4) -> TokenLoss:
  """GMPO: geometric mean of token ratios, clipped per token in log space.

  .. math::
    δ^c_{i,t} = sgn(A)·min(sgn(A)·δ, sgn(A)·clip(δ, −ε_low, ε_high))
    r_i = exp(Σ_t M δ^c_{i,t} / |o_i|),   Ā_i = Σ_t M A_{i,t} / |o_i|
    ℓ_{i,t} = −Ā_i r_i   (the same value on every valid token of row i)

  Under ``seq-mean-token-mean`` (default) the loss is (1/B') Σ_i −Ā_i r_i. Y. Zhao et al.,
  "Geometric-Mean Policy Optimization", arXiv 2507.20673 (ε = 0.4 in log space, i.e.
  ratio range (e^{−0.4}, e^{0.4})). Deviations: δ is clamped to ±20 first; |o_i| uses
  max(|o_i|, 1) instead of +1e-8; empty rows are excluded from the mean (verl averages
  over all rows); with `logprob_sampler` the token weights are averaged arithmetically
  by the aggregation (verl takes their geometric mean per sequence).

  Confidence: code-verified (verl `core_algos.py` `compute_policy_loss_geo_mean`).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: log-space clip ε_low, ε_high.

  Returns:
    TokenLoss; metrics `clipfrac` (clipped tokens with A>0), `clipfrac_lower` (A<0) and
    `seq_ratio_mean/max/min` of r_i.
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  sgn = jnp.sign(x.adv)
  d_clip = jnp.clip(x.delta, -clip_low, clip_high)
  d_min = sgn * jnp.minimum(sgn * x.delta, sgn * d_clip)
  log_r_B = seq_mean(d_min, x.mask)
  adv_B = seq_mean(x.adv, x.mask)
  loss_B = -adv_B * jnp.exp(log_r_B)
  loss_BT = jnp.where(x.mask, loss_B[:, None], 0.0)
  clipped = x.delta != d_clip
  return TokenLoss(loss_BT, {"clipfrac": clipped & (x.adv > 0),
                             "clipfrac_lower": clipped & (x.adv < 0),
                             **seq_ratio_metrics(log_r_B, x.mask)})
