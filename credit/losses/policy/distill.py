"""Full-distribution distillation on the student's tokens: PPO clip + a top-k divergence term.

The per-token advantage form of on-policy distillation (`opd`, ..., in
`credit.advantages.distill`) uses only the sampled token. These losses add the divergence
between the student's and the teacher's next-token distributions restricted to the
teacher's top-k ids plus one tail bucket (`credit.scoring.teacher_scores_hidden`,
`credit.divergences.topk_buckets`): the update scores those ids itself (`logprob_topk`, from
the same chunked pass as `logprob`), so no [B,T,V] array exists on either side.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.divergences import divergence_from_logprobs
from credit.losses.policy._common import policy_inputs
from credit.losses.policy.ppo_clip import _check_dual, clipped_surrogate_loss
from credit.losses.reduction import POLICY_NEEDS, STATIC_ARGNAMES, TokenLoss, _full_loss
from credit.registry import register_policy_loss

__all__ = ["topk_distill_loss", "sd_search_loss", "DISTILL_KINDS"]

Array = jax.Array

DISTILL_KINDS = ("reverse_kl", "forward_kl", "js")
_TOPK_FIELDS = ("logprob_topk", "teacher_topk_logprob")
_OPD_PAPER = ("On-policy distillation: Thinking Machines Lab, 'On-Policy Distillation' (2025); "
              "MiniLLM, arXiv 2306.08543; GKD, arXiv 2306.13649")
_SDS_PAPER = ("SD-Search: hindsight self-distillation with token-level JSD at search-query "
              "positions, arXiv preprint")


def _distill_term(m_BT: Array, logprob_topk, teacher_topk_logprob, kind: str,
                  beta) -> Array:
  """[B,T] divergence D(student buckets ‖ teacher buckets), 0 outside `m_BT`."""
  check_choice("topk_distill_loss", "kind", kind, DISTILL_KINDS)
  s = jnp.asarray(logprob_topk, jnp.float32)
  t = jnp.asarray(teacher_topk_logprob, jnp.float32)
  chex.assert_rank([s, t], 3)
  chex.assert_equal_shape([s, t])
  chex.assert_equal_shape_prefix([s, m_BT], 2)
  # Masked positions may hold anything (zeros): give them a valid distribution first.
  uniform = -jnp.log(jnp.float32(s.shape[-1]))
  s = jnp.where(m_BT[..., None], s, uniform)
  t = jnp.where(m_BT[..., None], t, uniform)
  return divergence_from_logprobs(s, t, kind=kind, beta=beta, mask=m_BT)


def topk_distill_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                      response_mask: ArrayLike, logprob_topk: ArrayLike,
                      teacher_topk_logprob: ArrayLike, coef: ArrayLike = 1.0,
                      kind: str = "reverse_kl", beta: ArrayLike = 0.5,
                      pg_coef: ArrayLike = 1.0, clip_low: ArrayLike = 0.2,
                      clip_high: ArrayLike = 0.2,
                      clip_ratio_c: ArrayLike | None = 3.0) -> TokenLoss:
  """PPO clip on the estimator's advantages plus a top-k distillation divergence per token.

  ::

    ℓ_t = c_pg ℓ^PPO_t(A) + λ D_kind(p̄_S(·|s_t) ‖ p̄_T(·|s_t))

  with p̄ the student's and the teacher's next-token distributions coarsened to the
  teacher's top-k ids plus one tail bucket (`logprob_topk`, `teacher_topk_logprob`).
  kind: reverse_kl KL(p̄_S ‖ p̄_T) (on-policy distillation's full-distribution form,
  MiniLLM), forward_kl KL(p̄_T ‖ p̄_S), js the generalised JSD_β of GKD. Gradients reach
  the student through `logprob_topk` only. With k = V this is the full divergence; for
  k < V the divergence of the coarsened distributions, a lower bound.

  Use it with any estimator: `opd` and this term, `grpo` and this term (outcome RL with
  dense distillation), or `pg_coef=0` for pure distillation.

  Papers: "On-Policy Distillation" (Thinking Machines Lab, 2025); MiniLLM, arXiv
  2306.08543 (reverse KL); GKD, arXiv 2306.13649 (JSD_β). The tail bucket is this
  library's.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    logprob_topk: [B,T,k] float, the current policy's bucket log-probs (differentiated).
    teacher_topk_logprob: [B,T,k] float, the teacher's (last entry: the tail bucket).
    coef: λ, the divergence's weight.
    kind: static, "reverse_kl" | "forward_kl" | "js".
    beta: the JSD_β teacher weight (kind "js").
    pg_coef: weight of the PPO term (0: distillation only).
    clip_low: PPO ε_low.
    clip_high: PPO ε_high.
    clip_ratio_c: dual-clip constant.

  Returns:
    TokenLoss; metrics `clipfrac` and `distill_div` (the divergence per token).
  """
  _check_dual(clip_ratio_c)
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  pg_BT, clipped, _ = clipped_surrogate_loss(x.adv, jnp.exp(x.delta), 1.0 - clip_low,
                                             1.0 + clip_high, clip_ratio_c)
  div_BT = _distill_term(x.mask, logprob_topk, teacher_topk_logprob, kind, beta)
  loss_BT = jnp.asarray(pg_coef, jnp.float32) * pg_BT + jnp.asarray(coef, jnp.float32) * div_BT
  return TokenLoss(jnp.where(x.mask, loss_BT, 0.0),
                   {"clipfrac": clipped, "distill_div": jax.lax.stop_gradient(div_BT)})


def sd_search_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                   response_mask: ArrayLike, logprob_topk: ArrayLike,
                   teacher_topk_logprob: ArrayLike, query_mask: ArrayLike,
                   coef: ArrayLike = 1.0, kind: str = "js", beta: ArrayLike = 0.5,
                   clip_low: ArrayLike = 0.2, clip_high: ArrayLike = 0.2,
                   clip_ratio_c: ArrayLike | None = 3.0) -> TokenLoss:
  """SD-Search: PPO clip (GRPO advantages) + λ · JSD to a hindsight self-teacher at query tokens.

  ::

    ℓ_t = ℓ^PPO_t(A) + λ 1[t ∈ query] JSD(p̄_S(·|s_t), p̄_T(·|s_t))

  The teacher is the policy conditioned on a hindsight block (the runner's self-teacher,
  `--config.teacher.context`), scored on the student's tokens with its top-k distribution;
  the divergence applies only on the tokens of the search queries the response issued
  (`query_mask`). JSD is the symmetric one (β = 0.5) over k + 1 buckets; for example
  p = [0.7, 0.2, 0.1], q = [0.2, 0.5, 0.3] give 0.132918. The term is a per-token loss
  reduced like the PPO term, so a λ written as a mean over query tokens equals `coef`
  divided by the batch's `query_frac`.

  Paper: "SD-Search: hindsight self-distillation" (arXiv preprint). The abstract states
  the token-level JSD at query positions added to GRPO; λ = 1 and k are this library's.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    logprob_topk: [B,T,k] float, the current policy's bucket log-probs.
    teacher_topk_logprob: [B,T,k] float, the teacher's.
    query_mask: [B,T] bool, the query tokens (only where `response_mask` too).
    coef: λ.
    kind: static, as `topk_distill_loss`.
    beta: JSD weight.
    clip_low: PPO ε_low.
    clip_high: PPO ε_high.
    clip_ratio_c: dual-clip constant.

  Returns:
    TokenLoss; metrics `clipfrac`, `distill_div` and `query_frac` (share of policy tokens
    in queries).
  """
  _check_dual(clip_ratio_c)
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  q_BT = jnp.asarray(query_mask).astype(bool)
  chex.assert_equal_shape([q_BT, x.mask])
  q_BT = q_BT & x.mask
  pg_BT, clipped, _ = clipped_surrogate_loss(x.adv, jnp.exp(x.delta), 1.0 - clip_low,
                                             1.0 + clip_high, clip_ratio_c)
  div_BT = _distill_term(q_BT, logprob_topk, teacher_topk_logprob, kind, beta)
  loss_BT = pg_BT + jnp.asarray(coef, jnp.float32) * div_BT
  return TokenLoss(jnp.where(x.mask, loss_BT, 0.0),
                   {"clipfrac": clipped, "distill_div": jax.lax.stop_gradient(div_BT),
                    "query_frac": q_BT})


# Registered by hand (not with `policy_loss`): the losses take contract fields beyond
# `POLICY_NEEDS`; the full loss is the per-token term + the shared reduction.
register_policy_loss("topk_distill", needs=POLICY_NEEDS + _TOPK_FIELDS, paper=_OPD_PAPER,
                     static_argnames=STATIC_ARGNAMES + ("kind",),
                     token_fn=topk_distill_loss,
                     confidence="paper-equation",
                     source=_OPD_PAPER + " (the tail bucket is this library's)")(
                         _full_loss("topk_distill", topk_distill_loss, "token-mean"))
register_policy_loss("sd_search", needs=POLICY_NEEDS + _TOPK_FIELDS + ("query_mask",),
                     paper=_SDS_PAPER, static_argnames=STATIC_ARGNAMES + ("kind",),
                     token_fn=sd_search_loss,
                     confidence="inferred",
                     source=_SDS_PAPER + ", abstract")(
                         _full_loss("sd_search", sd_search_loss, "token-mean"))
