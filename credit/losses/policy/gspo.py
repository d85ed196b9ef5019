"""GSPO (length-normalised sequence ratio, GSPO-token form) and LUSPO (length-scaled GSPO)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import (PolicyInputs, policy_inputs, seq_len, seq_mean,
                                          seq_ratio_metrics)
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["gspo_loss", "luspo_loss"]

Array = jax.Array


def gspo_token_loss(x: PolicyInputs, clip_low: ArrayLike,
                    clip_high: ArrayLike) -> tuple[Array, Array, Array]:
  """GSPO-token per-token losses [B,T], clip indicator [B,T] and the per-row log s_i [B]."""
  log_s_B = seq_mean(x.delta, x.mask)
  sg_lp = jax.lax.stop_gradient(x.lp)
  log_s_BT = jax.lax.stop_gradient(log_s_B)[:, None] + (x.lp - sg_lp)
  s_BT = jnp.exp(jnp.minimum(log_s_BT, 10.0))
  l1 = -x.adv * s_BT
  l2 = -x.adv * jnp.clip(s_BT, 1.0 - clip_low, 1.0 + clip_high)
  return jnp.maximum(l1, l2), l2 > l1, log_s_B


@policy_loss("gspo", "GSPO: Group Sequence Policy Optimization, arXiv 2507.18071",
             loss_agg_mode="seq-mean-token-mean",
             confidence="code-verified",
             source=("GSPO, arXiv 2507.18071; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_gspo"))
def gspo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
              response_mask: ArrayLike, clip_low: ArrayLike = 3e-4,
              clip_high: ArrayLike = 4e-4) -> TokenLoss:
  """GSPO with the length-normalised sequence ratio, in the GSPO-token form.

  ::

    log s_i   = Σ_t M δ[i,t] / max(L_i, 1)
    log s[i,t] = sg[log s_i] + log π[i,t] − sg[log π[i,t]],      clamped ≤ 10
    ℓ[i,t]    = max(−A s[i,t], −A clip(s[i,t], 1 − ε_low, 1 + ε_high))

  The value of s[i,t] is s_i, so a whole sequence is clipped or not; the gradient is per
  token, −A s_i ∇log π[i,t] when unclipped. With sequence-constant advantages and
  ``seq-mean-token-mean`` (the default) this is GSPO's sequence objective. No dual clip.

  Paper: "Group Sequence Policy Optimization", arXiv 2507.18071 (eqs. 5-7, 10-11;
  ε = 3e-4 / 4e-4). Differences from verl's `compute_policy_loss_gspo`: token δ is
  clamped to ±20 before averaging; other aggregation modes are allowed.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    clip_low: ε_low on the sequence ratio.
    clip_high: ε_high on the sequence ratio.

  Returns:
    TokenLoss; metrics `clipfrac` (token share in clipped sequences) and
    `seq_ratio_mean/max/min` over non-empty rows.

  Example:
    >>> import numpy as np
    >>> out = gspo_loss(logprob=np.array([[-0.98, -0.96]]), logprob_old=-np.ones((1, 2)),
    ...                 advantages=np.ones((1, 2)), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 4).tolist()   # s = e^0.03, clipped
    [[-1.0004, -1.0004]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  loss_BT, clipped, log_s_B = gspo_token_loss(x, clip_low, clip_high)
  return TokenLoss(loss_BT, {"clipfrac": clipped, **seq_ratio_metrics(log_s_B, x.mask)})


@policy_loss("luspo", "LUSPO: Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261",
             loss_agg_mode="seq-mean-token-mean",
             confidence="paper-equation",
             source=("LUSPO, arXiv 2602.05261 (its description: scale each sequence's loss by "
                     "its length)"))
def luspo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
               response_mask: ArrayLike, clip_low: ArrayLike = 3e-4,
               clip_high: ArrayLike = 4e-4) -> TokenLoss:
  """LUSPO: GSPO with each sequence's loss scaled by its length L_i.

  ::

    ℓ[i,t] = L_i · ℓ^GSPO[i,t]

  Under ``seq-mean-token-mean`` (the default) the objective is
  (1/B') Σ_i L_i min(s_i A_i, clip(s_i) A_i): every token's gradient carries weight s_i A_i
  instead of GSPO's s_i A_i / L_i, which under-weights long answers and which the paper
  links to response-length collapse. It equals `gspo_loss` with ``seq-mean-token-sum``.

  Paper: "Length-Unbiased Sequence Policy Optimization: Revealing and Controlling
  Response Length Variation in RLVR", arXiv 2602.05261 ("scale each sequence's loss by
  its length").

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    clip_low: ε_low on the sequence ratio.
    clip_high: ε_high on the sequence ratio.

  Returns:
    TokenLoss with the metrics of `gspo_loss`.

  Example:
    >>> import numpy as np
    >>> out = luspo_loss(logprob=np.array([[-0.98, -0.96]]), logprob_old=-np.ones((1, 2)),
    ...                  advantages=np.ones((1, 2)), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 4).tolist()
    [[-2.0008, -2.0008]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  loss_BT, clipped, log_s_B = gspo_token_loss(x, clip_low, clip_high)
  loss_BT = loss_BT * seq_len(x.mask)[:, None]
  return TokenLoss(loss_BT, {"clipfrac": clipped, **seq_ratio_metrics(log_s_B, x.mask)})
