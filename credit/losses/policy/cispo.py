"""CISPO: clip the stop-gradient importance weight, never the token's gradient."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["cispo_loss"]


@policy_loss("cispo", "CISPO (MiniMax-M1: Scaling Test-Time Compute Efficiently with "
             "Lightning Attention), arXiv 2506.13585",
             confidence="code-verified",
             source=("MiniMax-M1 (CISPO), arXiv 2506.13585; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_cispo"))
def cispo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
               response_mask: ArrayLike, clip_low: ArrayLike = 1.0,
               clip_high: ArrayLike = 0.28) -> TokenLoss:
  """CISPO: clip the (stop-gradient) importance weight, never the token's gradient.

  ::

    r̂ = clip(e^δ, 1 − ε_low, 1 + ε_high),    ℓ = −sg[r̂] A log π

  Every token keeps a gradient, where PPO drops those outside the band.

  Paper: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
  arXiv 2506.13585 (eq. 4; no lower bound: "we set ε_low to a large value"). Defaults
  ε_low = 1 (lower bound 0) and ε_high = 0.28 follow Trinity-RFT's CISPO defaults; tune
  ε_high. As verl's `compute_policy_loss_cispo`.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    clip_low: ε_low of the weight clip.
    clip_high: ε_high of the weight clip.

  Returns:
    TokenLoss; metrics `clipfrac` (tokens whose weight was clipped).

  Example:
    >>> import numpy as np
    >>> out = cispo_loss(logprob=np.log([[0.5, 0.9]]), logprob_old=np.log([[0.25, 0.9]]),
    ...                  advantages=np.array([[1., -1.]]), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()   # weight 2 clipped to 1.28
    [[0.887228, -0.105361]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  ratio = jnp.exp(x.delta)
  w = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
  return TokenLoss(-w * x.adv * x.lp, {"clipfrac": w != ratio})
