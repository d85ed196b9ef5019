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
    optional_needs={"reward": "outcome_coef", "group_id": "outcome_coef"})
def opd_advantages(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                   logprob_teacher: ArrayLike, reward: ArrayLike | None = None,
                   group_id: ArrayLike | None = None, num_groups: int | None = None,
                   group_size: int | None = None, kl_coef: ArrayLike = 1.0,
                   outcome_coef: ArrayLike = 0.0, eps: ArrayLike = 1e-6,
                   teacher_floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """OPD: the negative sampled-token reverse KL to a teacher as a dense advantage (γ = 0).

  Confidence: paper-equation (the Thinking Machines write-up: the student samples, the
  teacher scores every sampled token, the per-token negative reverse KL
  log π_T(y_t) − log π_θ(y_t) is the advantage with discount zero, optimised by the ordinary
  importance-weighted policy-gradient loss; spec `distill_and_structure.md` A1). The same
  sampled-token form is what OPD code paths of RL trainers subtract from the advantage,
  e.g. `apply_opd_kl_to_advantages` in DeepExperience/HyperEyes
  (`Relax/relax/backends/megatron/loss.py`: adv −= coef·(logp_student − logp_teacher)).

  .. math::
    δ_{b,t} = \\max(ℓᵀ_{b,t}, −20) − ℓˢ_{b,t}
    A_{b,t} = α·δ_{b,t} + c·Â_b      on response tokens, 0 elsewhere

  ℓˢ = `logprob_old` (the student that sampled), ℓᵀ = `logprob_teacher` (the teacher on the
  same tokens; teacher and student must share the tokenizer). No return accumulation and no
  group normalisation. The clamp of ℓᵀ at −20 (a teacher giving probability 0) is the
  spec's choice. The optional outcome mixture (the spec's "mixture with outcome RL") adds
  c·Â_b, Â_b the GRPO advantage (unbiased group std, ε = 1e-6) of `reward`; it needs
  `reward` and `group_id` (registry `optional_needs`, switched on by `outcome_coef`).
  Choice (ours): the outcome term is scaled by c rather than added with weight 1, so that
  c = 0 is pure OPD and the mixture weight is explicit. Properties: a teacher equal to the
  student (ℓᵀ = ℓˢ ≥ −20) gives exactly 0 (pure OPD) or c·Â_b (mixture). The full-
  distribution (top-k) variant is a loss, not an advantage: policy loss `topk_distill`
  (`credit.losses.policy.distill`), with the teacher's top-k distribution from the runner.

  Args:
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour policy) log-prob of the sampled token.
    logprob_teacher: [B,T] float teacher log-prob of the same token.
    reward: optional [B] float outcome, used when `outcome_coef` != 0.
    group_id: optional [B] int group of each row (outcome term, segment path).
    num_groups: static number of groups (outcome term; defaults to B/G on the fast path).
    group_size: static G for contiguous groups (outcome term, fast path).
    kl_coef: α, weight of the teacher term (1.0: pure OPD).
    outcome_coef: c, weight of the GRPO outcome term (0.0: off).
    eps: added to the group std of the outcome term.
    teacher_floor: lower clamp of ℓᵀ (−20).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`, without gradient.

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
