"""PPO clipped surrogate (decoupled clip-higher bounds, dual clip) and its shared core."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["ppo_clip_loss"]

Array = jax.Array


def clipped_surrogate_loss(adv: Array, ratio: Array, low: ArrayLike, high: ArrayLike,
                           clip_ratio_c: ArrayLike | None) -> tuple[Array, Array, Array]:
  """(ℓ, clipped, dual_active) for ℓ = max(−Aρ, −A·clip(ρ, low, high)) with dual clip.

  `low`/`high` are ratio bounds (scalars or [B,T]); with `clip_ratio_c` = c, ℓ becomes
  min(ℓ, −A·c) where A < 0. `clipped` marks the clipped branch active, `dual_active` the
  dual clip active (bool [B,T]).
  """
  l1 = -adv * ratio
  l2 = -adv * jnp.clip(ratio, low, high)
  lc = jnp.maximum(l1, l2)
  clipped = l2 > l1
  if clip_ratio_c is None:
    return lc, clipped, jnp.zeros_like(clipped)
  l3 = -adv * clip_ratio_c
  neg = adv < 0
  return jnp.where(neg, jnp.minimum(lc, l3), lc), clipped, neg & (lc > l3)


def _check_dual(clip_ratio_c):
  if isinstance(clip_ratio_c, (int, float)) and clip_ratio_c <= 1.0:
    raise ValueError(f"clip_ratio_c must be > 1 (dual-clip PPO), got {clip_ratio_c}")


@policy_loss("ppo_clip", "PPO: Proximal Policy Optimization Algorithms, arXiv 1707.06347; "
             "dual clip: arXiv 1912.09729; clip-higher: DAPO, arXiv 2503.14476",
             confidence="code-verified",
             source=("PPO, arXiv 1707.06347; dual clip, arXiv 1912.09729; clip-higher, DAPO, "
                     "arXiv 2503.14476; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla"))
def ppo_clip_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                  response_mask: ArrayLike, clip_low: ArrayLike = 0.2,
                  clip_high: ArrayLike = 0.2,
                  clip_ratio_c: ArrayLike | None = 3.0) -> TokenLoss:
  """PPO clipped surrogate with decoupled (clip-higher) bounds and dual clip.

  ::

    δ = clip(log π − log π_old, −20, 20),   ρ = e^δ
    ℓ_c = max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high))
    ℓ = ℓ_c if A ≥ 0 else min(ℓ_c, −A c)

  Papers: "Proximal Policy Optimization Algorithms", arXiv 1707.06347 (eq. 7); dual clip
  from "Mastering Complex Control in MOBA Games with Deep RL", arXiv 1912.09729 (c = 3);
  clip-higher ε_high = 0.28 from DAPO, arXiv 2503.14476. With ε = 0.2 and token-mean
  aggregation this is GRPO's loss. As verl's vanilla policy loss.

  Args:
    logprob: [B,T] float32 current log-probs (differentiated).
    logprob_old: [B,T] float32 behaviour / proximal log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    clip_low: ε_low.
    clip_high: ε_high.
    clip_ratio_c: dual-clip constant c > 1 for A < 0; None disables the dual clip.

  Returns:
    TokenLoss; metrics `clipfrac` (the clipped branch active) and `clipfrac_lower` (the dual
    clip active).

  Example:
    >>> import numpy as np
    >>> out = ppo_clip_loss(logprob=np.array([[-0.7]]), logprob_old=np.array([[-1.0]]),
    ...                     advantages=np.array([[0.866024]]), response_mask=np.ones((1, 1), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()   # ρ = 1.349859, clipped
    [[-1.039229]]
  """
  _check_dual(clip_ratio_c)
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  loss_BT, clipped, dual = clipped_surrogate_loss(x.adv, jnp.exp(x.delta), 1.0 - clip_low,
                                                  1.0 + clip_high, clip_ratio_c)
  return TokenLoss(loss_BT, {"clipfrac": clipped, "clipfrac_lower": dual})
