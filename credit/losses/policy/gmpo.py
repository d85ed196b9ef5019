"""GMPO: geometric mean of token ratios, clipped per token in log space."""
from __future__ import annotations

import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs, seq_mean, seq_ratio_metrics
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["gmpo_loss"]


@policy_loss("gmpo", "GMPO: Geometric-Mean Policy Optimization, arXiv 2507.20673",
             loss_agg_mode="seq-mean-token-mean",
             confidence="code-verified",
             source=("GMPO, arXiv 2507.20673; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_geo_mean"))
def gmpo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
              response_mask: ArrayLike, clip_low: ArrayLike = 0.4,
              clip_high: ArrayLike = 0.4) -> TokenLoss:
  """GMPO: geometric mean of token ratios, clipped per token in log space.

  ::

    δᶜ[i,t] = sgn(A) min(sgn(A) δ, sgn(A) clip(δ, −ε_low, ε_high))
    r_i = exp(Σ_t M δᶜ[i,t] / L_i),    Ā_i = Σ_t M A[i,t] / L_i
    ℓ[i,t] = −Ā_i r_i                  (the same value on every valid token of row i)

  The geometric mean is less sensitive than the arithmetic one to a few extreme token
  ratios. Under ``seq-mean-token-mean`` (default) the loss is (1/B') Σ_i −Ā_i r_i.

  Paper: "Geometric-Mean Policy Optimization", arXiv 2507.20673 (ε = 0.4 in log space).
  Differences from verl's `compute_policy_loss_geo_mean`: δ is clamped to ±20 first; the
  length uses max(L_i, 1) instead of + 1e-8; empty rows are excluded from the mean; with
  `logprob_sampler` the token weights are averaged arithmetically by the aggregation (verl
  takes their geometric mean per sequence).

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    clip_low: log-space ε_low.
    clip_high: log-space ε_high.

  Returns:
    TokenLoss; metrics `clipfrac` (clipped tokens with A > 0), `clipfrac_lower` (A < 0)
    and `seq_ratio_mean/max/min` of r_i.

  Example:
    >>> import numpy as np
    >>> out = gmpo_loss(logprob=np.log([[0.5, 0.5]]), logprob_old=np.log([[0.25, 0.5]]),
    ...                 advantages=np.array([[1., 1.]]), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()   # δᶜ = [0.4, 0], r = e^0.2
    [[-1.221403, -1.221403]]
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
