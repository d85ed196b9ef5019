"""DiffGate: difficulty-gated, bounded teacher guidance on failed rollouts, added to GRPO."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.distill._teach import TEACHER_FLOOR, grpo_rows, teacher_gap
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["diffgate_advantages"]

_PAPER = ("DiffGate: difficulty-gated teacher guidance for RL with verifiable rewards, arXiv "
          "preprint")


@register_estimator(
    "diffgate", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "group_std"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def diffgate_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                        response_mask: ArrayLike, logprob_old: ArrayLike,
                        logprob_teacher: ArrayLike, num_groups: int,
                        group_size: int | None = None, coef: ArrayLike = 1.0,
                        bound: ArrayLike = 1.0, success_threshold: ArrayLike = 1.0,
                        group_std: Literal["unbiased", "population", "none"] = "unbiased",
                        eps: ArrayLike = 1e-6,
                        teacher_floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """DiffGate: GRPO plus teacher guidance on failed rollouts, gated by group difficulty.

  GRPO stays the main signal; teacher guidance is added only where the student fails, more
  of it on harder prompts, and bounded so that a huge teacher–student gap cannot
  dominate::

    c_b = [R_b ≥ τ_c],   d_g = 1 − mean_{b∈g} c_b,   δ = max(ℓᵀ, −20) − ℓˢ
    A[b,t] = Â_b + λ · d_{g(b)} · (1 − c_b) · κ · tanh(δ[b,t] / κ)

  with Â_b GRPO of `reward` and d_g the group's failure rate. An all-fail group gets pure
  bounded distillation (Â = 0, d = 1) instead of GRPO's zero; an all-correct group gets
  pure GRPO. The output carries no gradient.

  Paper: "DiffGate: difficulty-gated teacher guidance for RL with verifiable rewards"
  (arXiv preprint). The abstract gives the idea but no equation: the formula and
  λ = κ = 1, τ_c = 1 are this library's reading of it.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour) log-prob of the sampled token, ℓˢ.
    logprob_teacher: [B,T] float teacher log-prob of the same token, ℓᵀ.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    coef: λ, weight of the teacher term.
    bound: κ > 0, the tanh bound of the token gap.
    success_threshold: a row is correct when reward ≥ this.
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.
    teacher_floor: lower clamp of ℓᵀ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = diffgate_advantages(reward=np.array([1., 0., 0., 0.]), group_id=np.zeros(4, int),
    ...     response_mask=np.ones((4, 2), bool), logprob_old=np.zeros((4, 2)),
    ...     logprob_teacher=np.array([[0., 0.], [0.5, -2.0], [3.0, 0.1], [0., 0.]]),
    ...     num_groups=1)
    >>> np.round(np.asarray(a[1:3], np.float64), 6).tolist()
    [[-0.153411, -1.22302], [0.246292, -0.425248]]
  """
  g = grpo_rows("diffgate_advantages", reward, group_id, response_mask, num_groups,
                group_size, group_std=group_std, eps=eps)
  rows, mask_BT = g.rows, g.rows.mask
  fail_B = rows.valid & ~(rows.values >= jnp.asarray(success_threshold, jnp.float32))
  n_fail_B = ops.group_reduce_rows(fail_B.astype(jnp.float32), rows.group_id, rows.valid,
                                   num_groups, group_size, "sum")
  n_B = ops.group_count_rows(rows.group_id, rows.valid, num_groups, group_size)
  diff_B = jnp.where(rows.valid, n_fail_B / jnp.maximum(n_B, 1.0), 0.0)
  kappa = jnp.asarray(bound, jnp.float32)
  delta_BT = teacher_gap(logprob_teacher, logprob_old, mask_BT, teacher_floor)
  gate_B = jnp.asarray(coef, jnp.float32) * diff_B * fail_B
  adv_BT = g.adv[:, None] + gate_B[:, None] * kappa * jnp.tanh(delta_BT / kappa)
  return jax.lax.stop_gradient(jnp.where(mask_BT, adv_BT, 0.0))
