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
             loss_agg_mode="seq-mean-token-mean")
def gspo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
              response_mask: ArrayLike, clip_low: ArrayLike = 3e-4,
              clip_high: ArrayLike = 4e-4) -> TokenLoss:
  """GSPO with the length-normalised sequence ratio, in the GSPO-token form.

  .. math::
    log s_i = Σ_t M δ_{i,t} / max(|o_i|, 1)
    log s_{i,t} = sg[log s_i] + log π_{i,t} − sg[log π_{i,t}],  clamped ≤ 10
    ℓ_{i,t} = max(−A s_{i,t}, −A·clip(s_{i,t}, 1−ε_low, 1+ε_high))

  The value of s_{i,t} is s_i (a whole sequence is clipped or not), the gradient is per
  token: ∇ℓ = −A s_i ∇log π_{i,t} when unclipped. With sequence-constant advantages and
  ``seq-mean-token-mean`` (the paper's and verl's forced mode, the default here) this is
  GSPO's sequence objective. No dual clip. C. Zheng et al., "Group Sequence Policy
  Optimization", arXiv 2507.18071 (eqs. 5-7, 10-11; ε = 3e-4 / 4e-4, §5.1); spec:
  outcome_and_clipping.md §6. Deviations: token δ is clamped to ±20 before averaging
  (verl does not clamp token δ); other aggregation modes are allowed (verl forces
  seq-mean-token-mean).

  Confidence: code-verified (verl `core_algos.py` `compute_policy_loss_gspo`).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: ε_low, ε_high on the sequence ratio.

  Returns:
    TokenLoss; metrics `clipfrac` (token share in clipped sequences) and
    `seq_ratio_mean/max/min` over non-empty rows.

  Example (outcome_and_clipping.md §6): token log-ratios [0.02, 0.04], A=1 → s=1.030455,
  ℓ=−1.0004 and a zero gradient; log-ratios [0.1, −0.3, 0.2] → s=1 (unclipped).
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  loss_BT, clipped, log_s_B = gspo_token_loss(x, clip_low, clip_high)
  return TokenLoss(loss_BT, {"clipfrac": clipped, **seq_ratio_metrics(log_s_B, x.mask)})


@policy_loss("luspo", "LUSPO: Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261",
             loss_agg_mode="seq-mean-token-mean")
def luspo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
               response_mask: ArrayLike, clip_low: ArrayLike = 3e-4,
               clip_high: ArrayLike = 4e-4) -> TokenLoss:
  """LUSPO: GSPO with each sequence's loss scaled by its length |o_i|.

  .. math::
    ℓ_{i,t} = |o_i| · ℓ^{GSPO}_{i,t}

  so that under ``seq-mean-token-mean`` (the default) the objective is
  (1/B') Σ_i |o_i|·min(s_i A_i, clip(s_i) A_i) and every token's gradient carries weight
  s_i A_i instead of s_i A_i/|o_i| (GSPO's per-token average under-weights long answers,
  which the paper links to response-length collapse). F. Liu et al., "Length-Unbiased
  Sequence Policy Optimization: Revealing and Controlling Response Length Variation in
  RLVR", arXiv 2602.05261. With ``seq-mean-token-mean`` it equals `gspo_loss` with
  ``seq-mean-token-sum``.

  Confidence: paper-equation (the paper's description, "scale each sequence's loss by its
  length"; the authors' code, murphy4122/luspo, was not in the searchable index, so this
  is the best-documented reading).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: ε_low, ε_high on the sequence ratio (as `gspo_loss`).

  Returns:
    TokenLoss with the metrics of `gspo_loss`.
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  loss_BT, clipped, log_s_B = gspo_token_loss(x, clip_low, clip_high)
  loss_BT = loss_BT * seq_len(x.mask)[:, None]
  return TokenLoss(loss_BT, {"clipfrac": clipped, **seq_ratio_metrics(log_s_B, x.mask)})
