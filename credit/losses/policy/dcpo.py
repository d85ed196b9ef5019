"""DCPO: PPO clip with per-token bounds from the old token probability."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32
from credit.losses.policy._common import policy_inputs
from credit.losses.policy.ppo_clip import clipped_surrogate_loss
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["dcpo_loss", "dcpo_clip_bounds"]

Array = jax.Array


def dcpo_clip_bounds(logprob_old: ArrayLike, eps_low: ArrayLike = 0.16,
                     eps_high: ArrayLike = 0.2, cap: ArrayLike = 10.0) -> tuple[Array, Array]:
  """DCPO's per-token ratio bounds from the old token probability q = exp(logprob_old).

  ::

    r_low = ½ + ½ sqrt(max(1 − 4 ε_low / q, 0)),    r_high = min(½ + ½ sqrt(1 + 4 ε_high / q), cap)

  the solution of abs((p/q − 1) p) ≤ ε for the ratio p/q: rare tokens get wide bounds.
  At q = 0 exactly the code returns r_low = 1; here the continuous limit ½ is used.

  Args:
    logprob_old: [..] log q (stop-gradient).
    eps_low: ε_low (the paper's README: 0.16; its run script: 0.2).
    eps_high: ε_high (README: 0.2; run script: 0.28).
    cap: upper cap on r_high (the code uses max(clip_ratio_c, 10)).

  Returns:
    (r_low, r_high), float32 arrays shaped like `logprob_old`.

  Example:
    >>> import numpy as np
    >>> lo, hi = dcpo_clip_bounds(np.log(np.array([0.9, 0.5, 0.01])), 0.16, 0.2, 5.0)
    >>> np.round(np.asarray(lo, np.float64), 6).tolist(), np.round(np.asarray(hi, np.float64), 6).tolist()
    ([0.768742, 0.5, 0.5], [1.187184, 1.306226, 5.0])
  """
  q = jnp.exp(jax.lax.stop_gradient(jnp.asarray(logprob_old, F32)))
  q = jnp.maximum(q, 1e-30)
  low = 0.5 + 0.5 * jnp.sqrt(jnp.maximum(1.0 - 4.0 * eps_low / q, 0.0))
  high = jnp.minimum(0.5 + 0.5 * jnp.sqrt(1.0 + 4.0 * eps_high / q), cap)
  return low, high


@policy_loss("dcpo", "DCPO: Dynamic Clipping Policy Optimization, arXiv 2509.02333",
             confidence="code-verified",
             source=("DCPO, arXiv 2509.02333; code: elysiameik-afk/dcpomol core_algos.py "
                     "(compute_policy_loss_dcpo, get_clip_low_high)"))
def dcpo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
              response_mask: ArrayLike, clip_low: ArrayLike = 0.16, clip_high: ArrayLike = 0.2,
              clip_ratio_c: ArrayLike = 10.0) -> TokenLoss:
  """DCPO dynamic-clip surrogate: PPO clip with per-token bounds from the old probability q.

  ::

    [r_low, r_high] = dcpo_clip_bounds(log π_old, ε_low, ε_high, max(c, 10))
    ℓ_c = max(−A ρ, −A clip(ρ, r_low, r_high));     ℓ = min(ℓ_c, −A c) where A < 0

  Tokens the old policy found unlikely may move further, so exploration of rare tokens is
  not clipped away.

  Paper: "DCPO: Dynamic Clipping Policy Optimization", arXiv 2509.02333 (clip type
  "dynamic", with the dual clip). δ is clamped to ±20 (the code does not clamp). The SAS
  advantage is the estimator `dcpo`; the paper's token-sum aggregation is
  `loss_agg_mode="token-sum"` plus an external scale.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    clip_low: ε_low of the bound formula (not a ratio offset).
    clip_high: ε_high of the bound formula.
    clip_ratio_c: dual-clip constant; the r_high cap is max(c, 10).

  Returns:
    TokenLoss; metrics `clipfrac`, `clipfrac_lower`, `clip_low_mean`, `clip_high_mean`.

  Example:
    >>> import numpy as np
    >>> out = dcpo_loss(logprob=np.log([[0.5, 0.9]]), logprob_old=np.log([[0.25, 0.9]]),
    ...                 advantages=np.array([[1., -1.]]), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()
    [[-1.524695, 1.0]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  low, high = dcpo_clip_bounds(x.lp_old, clip_low, clip_high, jnp.maximum(clip_ratio_c, 10.0))
  loss_BT, clipped, dual = clipped_surrogate_loss(x.adv, jnp.exp(x.delta), low, high,
                                                  clip_ratio_c)
  return TokenLoss(loss_BT, {"clipfrac": clipped, "clipfrac_lower": dual,
                             "clip_low_mean": low, "clip_high_mean": high})
