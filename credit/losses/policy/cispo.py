"""CISPO: clip the stop-gradient importance weight, never the token's gradient."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["cispo_loss"]


@policy_loss("cispo", "CISPO (MiniMax-M1: Scaling Test-Time Compute Efficiently with "
             "Lightning Attention), arXiv 2506.13585")
def cispo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
               response_mask: ArrayLike, clip_low: ArrayLike = 1.0,
               clip_high: ArrayLike = 0.28) -> TokenLoss:
  """CISPO: clip the (stop-gradient) IS weight, never the token's gradient.

  .. math::
    r̂ = clip(e^δ, 1−ε_low, 1+ε_high),   ℓ = −sg[r̂]·A·log π

  Every token keeps a gradient (PPO drops those outside the band). MiniMax, "MiniMax-M1:
  Scaling Test-Time Compute Efficiently with Lightning Attention", arXiv 2506.13585 (eq.
  4; token-mean over the group, no lower bound: "we set ε_low to a large value").
  Defaults ε_low = 1 (lower bound 0), ε_high = 0.28 follow Trinity-RFT's CISPO defaults;
  tune ε_high.

  Confidence: code-verified (verl `core_algos.py` `compute_policy_loss_cispo`).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: IS-weight clip ε_low, ε_high.

  Returns:
    TokenLoss; metrics `clipfrac` (tokens whose weight was clipped).
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  ratio = jnp.exp(x.delta)
  w = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
  return TokenLoss(-w * x.adv * x.lp, {"clipfrac": w != ratio})
