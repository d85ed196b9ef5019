"""OPD: on-policy distillation, the per-token teacher/student log-ratio as the advantage."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.advantages.distill._teach import (TEACHER_FLOOR, optional_grpo, response_mask_of,
                                              teacher_gap)
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["opd_advantages"]

_PAPER = ("On-Policy Distillation (Thinking Machines Lab blog, 2025), "
          "https://thinkingmachines.ai/blog/on-policy-distillation/")


@register_estimator(
    "opd", needs=("response_mask", "logprob_old", "logprob_teacher"), paper=_PAPER,
    static_argnames=("num_groups", "group_size"),
    optional_needs={"reward": "outcome_coef", "group_id": "outcome_coef"},
                    confidence="paper-equation",
                    source=_PAPER + " (its per-token reverse-KL advantage with discount zero)")
def opd_advantages(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                   logprob_teacher: ArrayLike, reward: ArrayLike | None = None,
                   group_id: ArrayLike | None = None, num_groups: int | None = None,
                   group_size: int | None = None, kl_coef: ArrayLike = 1.0,
                   outcome_coef: ArrayLike = 0.0, eps: ArrayLike = 1e-6,
                   teacher_floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """OPD: the negative sampled-token reverse KL to a teacher as a dense advantage.

  The student samples, the teacher scores every sampled token, and the per-token log-ratio
  is the advantage, with discount zero (no return accumulation, no group
  normalisation)::

    δ[b,t] = max(ℓᵀ[b,t], −20) − ℓˢ[b,t]
    A[b,t] = α · δ[b,t] + c · Â_b

  with ℓˢ = `logprob_old` (the student that sampled) and ℓᵀ = `logprob_teacher` (same
  tokenizer). The optional outcome term c·Â_b is GRPO of `reward` (needs `reward` and
  `group_id`; c = 0 is pure OPD). A teacher equal to the student gives 0. The
  full-distribution (top-k) variant is the policy loss `topk_distill`.

  Source: "On-Policy Distillation" (Thinking Machines Lab, 2025). The −20 clamp of ℓᵀ (a
  teacher giving probability 0) and the explicit outcome weight c are this library's.

  Args:
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour policy) log-prob of the sampled token.
    logprob_teacher: [B,T] float teacher log-prob of the same token.
    reward: optional [B] float outcome, used when `outcome_coef` ≠ 0.
    group_id: optional [B] int group of each row.
    num_groups: static number of groups (defaults to B/G on the fast path).
    group_size: static G for contiguous groups.
    kl_coef: α, weight of the teacher term.
    outcome_coef: c, weight of the GRPO outcome term.
    eps: added to the group std of the outcome term.
    teacher_floor: lower clamp of ℓᵀ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`, without gradient.

  Example:
    >>> import numpy as np
    >>> a = opd_advantages(response_mask=np.ones((1, 3), bool),
    ...                    logprob_old=np.array([[-0.5, -1.0, -2.0]]),
    ...                    logprob_teacher=np.array([[-0.3, -1.5, -0.1]]))
    >>> np.round(np.asarray(a, np.float64), 6).tolist()
    [[0.2, -0.5, 1.9]]
  """
  mask_BT = response_mask_of(response_mask)
  delta_BT = teacher_gap(logprob_teacher, logprob_old, mask_BT, teacher_floor)
  adv_BT = jnp.asarray(kl_coef, jnp.float32) * delta_BT
  out_B = optional_grpo("opd_advantages", "outcome_coef", outcome_coef, reward, group_id,
                        mask_BT, num_groups, group_size, eps)
  if out_B is not None:
    adv_BT = adv_BT + jnp.asarray(outcome_coef, jnp.float32) * out_B[:, None]
  return jax.lax.stop_gradient(jnp.where(mask_BT, adv_BT, 0.0))
