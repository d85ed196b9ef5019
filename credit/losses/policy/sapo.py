"""SAPO: a smooth sigmoid gate of the token ratio instead of a hard clip."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["sapo_loss"]


@policy_loss("sapo", "SAPO: Soft Adaptive Policy Optimization, arXiv 2511.20347",
             loss_agg_mode="seq-mean-token-mean",
             confidence="code-verified",
             source=("SAPO, arXiv 2511.20347; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_sapo"))
def sapo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
              response_mask: ArrayLike, tau_pos: ArrayLike = 1.0,
              tau_neg: ArrayLike = 1.05) -> TokenLoss:
  """SAPO: a smooth sigmoid gate of the token ratio instead of a hard clip.

  ::

    f_τ(ρ) = σ(τ (ρ − 1)) · 4/τ,    τ = τ_pos if A > 0 else τ_neg
    ℓ = −f_τ(ρ) A

  ∇ℓ = −4σ(1−σ) ρ A ∇log π: weight 1 on-policy (ρ = 1), decaying smoothly off-policy;
  τ_neg > τ_pos damps negative-advantage tokens faster.

  Paper: "Soft Adaptive Policy Optimization", arXiv 2511.20347. verl forces
  ``seq-mean-token-mean``, the default here. As verl's `compute_policy_loss_sapo`.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    tau_pos: gate temperature for A > 0.
    tau_neg: gate temperature for A ≤ 0.

  Returns:
    TokenLoss; metrics `gate_weight_mean`, the mean gradient weight 4σ(1−σ)ρ.

  Example:
    >>> import numpy as np
    >>> out = sapo_loss(logprob=np.log([[0.5, 0.9]]), logprob_old=np.log([[0.25, 0.9]]),
    ...                 advantages=np.array([[1., -1.]]), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()
    [[-2.924234, 1.904762]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  ratio = jnp.exp(x.delta)
  tau = jnp.where(x.adv > 0, tau_pos, tau_neg)
  sig = jax.nn.sigmoid(tau * (ratio - 1.0))
  sig_sg = jax.lax.stop_gradient(sig)
  return TokenLoss(-sig * (4.0 / tau) * x.adv,
                   {"gate_weight_mean": 4.0 * sig_sg * (1.0 - sig_sg) * ratio})
