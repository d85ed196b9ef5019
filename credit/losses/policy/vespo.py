"""VESPO: REINFORCE with a gamma-shaped kernel of the unnormalised sequence ratio."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32, LOG_CLAMP
from credit.losses.policy._common import policy_inputs, row_metrics, seq_mean
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["vespo_loss"]


@policy_loss("vespo", "VESPO: Variational Sequence-Level Soft Policy Optimization, "
             "arXiv 2602.10693",
             confidence="code-verified",
             source=("VESPO, arXiv 2602.10693; code: FloyedShen/VESPO "
                     "recipe/vespo/code/core_algos.py compute_policy_loss_vespo"))
def vespo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
               response_mask: ArrayLike, k_pos: ArrayLike = 2.0, lambda_pos: ArrayLike = 3.0,
               k_neg: ArrayLike = 3.0, lambda_neg: ArrayLike = 2.0) -> TokenLoss:
  """VESPO: REINFORCE with a gamma-shaped kernel of the *unnormalised* sequence ratio.

  ::

    log w_i = clip(Σ_t M δ[i,t], −20, 20)          (product of token ratios, no 1/L)
    φ(w) = w^k e^{λ(1 − w)} = exp(λ + k log w − λ w),    φ(1) = 1
    (k, λ) = (k_pos, λ_pos) if Ā_i ≥ 0 else (k_neg, λ_neg)
    ℓ[i,t] = −sg[φ(w_i)] A[i,t] log π[i,t]

  so ∇ℓ = −φ(w_i) A ∇log π: a soft trust region that down-weights sequences whose ratio has
  drifted far from 1, in either direction.

  Paper: "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable Off-Policy
  LLM Training", arXiv 2602.10693. Defaults as the authors' code (k+ = 2, λ+ = 3, k− = 3,
  λ− = 2). Differences: the advantage sign comes from the row's mean advantage (the code
  reads the first token); with `logprob_sampler` the sampler correction multiplies ℓ
  through the shared `importance_correction` instead of being folded into w.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    k_pos: kernel k for A ≥ 0.
    lambda_pos: kernel λ for A ≥ 0.
    k_neg: kernel k for A < 0.
    lambda_neg: kernel λ for A < 0.

  Returns:
    TokenLoss; metrics `phi_mean/max/min` over non-empty rows and `seq_log_ratio_mean`.

  Example:
    >>> import numpy as np
    >>> out = vespo_loss(logprob=np.log([[0.5, 0.9]]), logprob_old=np.log([[0.25, 0.9]]),
    ...                  advantages=np.array([[1., -1.]]), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()
    [[0.138039, -0.020982]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  log_w_B = jnp.clip(jnp.sum(x.delta, axis=-1), -LOG_CLAMP, LOG_CLAMP)
  pos_B = seq_mean(x.adv, x.mask) >= 0
  k_B = jnp.where(pos_B, k_pos, k_neg)
  lam_B = jnp.maximum(jnp.where(pos_B, lambda_pos, lambda_neg), 1e-4)
  phi_B = jax.lax.stop_gradient(jnp.exp(lam_B + k_B * log_w_B - lam_B * jnp.exp(log_w_B)))
  loss_BT = -phi_B[:, None] * x.adv * x.lp
  rows_B = jnp.any(x.mask, axis=-1)
  nr = jnp.maximum(jnp.sum(rows_B, dtype=F32), 1.0)
  log_w_mean = jnp.sum(jnp.where(rows_B, log_w_B, 0.0)) / nr
  return TokenLoss(loss_BT, {**row_metrics("phi", phi_B, rows_B),
                             "seq_log_ratio_mean": log_w_mean})
