"""JOLT: joint learning (privileged teacher role) and teaching (student role) in one model.

Registers two estimators, one per role: `jolt` (student-role rollouts: dense OPD toward the
teacher role) and `jolt_teacher` (teacher-role rollouts: GRPO with a per-token KL toward
the student role).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.advantages.distill._teach import (TEACHER_FLOOR, grpo_rows, optional_grpo,
                                              response_mask_of, teacher_gap)
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["jolt_advantages", "jolt_teacher_advantages"]

_PAPER = ("JOLT: joint learning and teaching with a privileged teacher role and a student "
          "role of one model, arXiv preprint")


@register_estimator(
    "jolt", needs=("response_mask", "logprob_old", "logprob_teacher"), paper=_PAPER,
    static_argnames=("num_groups", "group_size"),
    optional_needs={"reward": "reward_coef", "group_id": "reward_coef"},
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def jolt_advantages(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                    logprob_teacher: ArrayLike, reward: ArrayLike | None = None,
                    group_id: ArrayLike | None = None, num_groups: int | None = None,
                    group_size: int | None = None, reward_coef: ArrayLike = 0.0,
                    eps: ArrayLike = 1e-6, teacher_floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """JOLT student role: on-policy distillation toward the same model in its privileged teacher role.

  One model plays two roles: the teacher role sees privileged information (a reference
  answer, a hint), the student role does not. Student-role rollouts are trained by dense
  distillation toward the teacher role, optionally with their own outcome::

    A[b,t] = max(ℓ_{T|S}, −20) − ℓ_{S|S} + ρ · Â_b

  with ℓ_{S|S} = `logprob_old` (the student context scoring its own token), ℓ_{T|S} =
  `logprob_teacher` (the same model with the privileged context, on the student's token)
  and Â_b GRPO of the student-role `reward` (needed only when ρ ≠ 0). The teacher-role
  rows use `jolt_teacher_advantages`; the two losses are added. The output carries no
  gradient.

  Paper: "JOLT: joint learning and teaching" (arXiv preprint). The abstract gives the two
  roles but no equation: this instantiation and ρ = 0 are this library's.

  Args:
    response_mask: [B,T] bool, the policy's tokens (student-role rollouts).
    logprob_old: [B,T] float ℓ_{S|S}.
    logprob_teacher: [B,T] float ℓ_{T|S}.
    reward: optional [B] student-role outcome, used when `reward_coef` ≠ 0.
    group_id: optional [B] int group of each row.
    num_groups: static number of groups (defaults to B/G on the fast path).
    group_size: static G for contiguous groups.
    reward_coef: ρ, weight of the student-role GRPO term.
    eps: added to the group std.
    teacher_floor: lower clamp of ℓ_{T|S}.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = jolt_advantages(response_mask=np.ones((1, 3), bool),
    ...                     logprob_old=np.array([[-0.5, -1.0, -2.0]]),
    ...                     logprob_teacher=np.array([[-0.3, -1.5, -0.1]]))
    >>> np.round(np.asarray(a, np.float64), 6).tolist()
    [[0.2, -0.5, 1.9]]
  """
  mask_BT = response_mask_of(response_mask)
  adv_BT = teacher_gap(logprob_teacher, logprob_old, mask_BT, teacher_floor)
  out_B = optional_grpo("jolt_advantages", "reward_coef", reward_coef, reward, group_id,
                        mask_BT, num_groups, group_size, eps)
  if out_B is not None:
    adv_BT = adv_BT + jnp.asarray(reward_coef, jnp.float32) * out_B[:, None]
  return jax.lax.stop_gradient(jnp.where(mask_BT, adv_BT, 0.0))


@register_estimator(
    "jolt_teacher", needs=("reward", "group_id", "response_mask", "logprob_old",
                           "logprob_alt"),
    paper=_PAPER, static_argnames=("num_groups", "group_size"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def jolt_teacher_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                            response_mask: ArrayLike, logprob_old: ArrayLike,
                            logprob_alt: ArrayLike, num_groups: int,
                            group_size: int | None = None, kl_coef: ArrayLike = 0.05,
                            eps: ArrayLike = 1e-6,
                            teacher_floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """JOLT teacher role: GRPO with a per-token KL toward the student role.

  The teacher role (privileged context) is trained on its own outcome, while a k1 KL
  penalty toward the student role keeps its behaviour reachable without the privileged
  information, so the student can imitate it::

    A[b,t] = Â_b − β · (ℓ_{T|T} − max(ℓ_{S|T}, −20))[b,t]

  with ℓ_{T|T} = `logprob_old` (rows sampled in the teacher role) and ℓ_{S|T} =
  `logprob_alt` (the same tokens re-scored with the privileged context removed). The
  teacher term is per-token, so it is not zero in equal-reward or one-row groups. The
  runner runs this only inside a JOLT run, on the teacher role's own rows.

  Paper: "JOLT: joint learning and teaching" (arXiv preprint); β = 0.05 and the −20 clamp
  are this library's.

  Args:
    reward: [B] float teacher-role outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens (teacher-role rollouts).
    logprob_old: [B,T] float ℓ_{T|T}.
    logprob_alt: [B,T] float ℓ_{S|T}.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    kl_coef: β.
    eps: added to the group std.
    teacher_floor: lower clamp of ℓ_{S|T}.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = jolt_teacher_advantages(reward=np.array([1.0, 0.0]), group_id=np.array([0, 0]),
    ...     response_mask=np.ones((2, 1), bool), logprob_old=np.array([[-0.1], [-0.5]]),
    ...     logprob_alt=np.array([[-0.5], [-0.5]]), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 6).tolist()
    [[0.687106], [-0.707106]]
  """
  g = grpo_rows("jolt_teacher_advantages", reward, group_id, response_mask, num_groups,
                group_size, eps=eps)
  mask_BT = g.rows.mask
  # ℓ_{T|T} − ℓ_{S|T} = −(max(ℓ_{S|T}, floor) − ℓ_{T|T}).
  kl_BT = -teacher_gap(logprob_alt, logprob_old, mask_BT, teacher_floor)
  adv_BT = g.adv[:, None] - jnp.asarray(kl_coef, jnp.float32) * kl_BT
  # Rows outside the groups (empty, or a group id out of range) get exact zeros.
  return jax.lax.stop_gradient(jnp.where(mask_BT & g.rows.valid[:, None], adv_BT, 0.0))
