"""Pieces shared by the teacher-gap estimators of this family (OPD, SCOPE, DiffGate, HyperEyes,
JOLT, SOLID); not a method module (private: `credit/_discover.py` skips it).

* `teacher_gap`: the sampled-token log-ratio δ = max(ℓᵀ, floor) − ℓˢ on the response
  tokens, exact 0 elsewhere (values outside the mask, even NaN/inf, never reach the output).
* `grpo_rows`: the group-row preamble plus the GRPO sequence advantage Â_b
  (`token/_redistribute.sequence_advantage`), for estimators that add a teacher term to it.
* `optional_grpo`: Â_b for estimators whose outcome term is switched on by a coefficient
  (`reward`/`group_id` then come in through `optional_needs`).
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import GROUP_STDS, sequence_advantage

Array = jax.Array

# Teacher log-probs below this are clamped before differencing (a teacher giving a
# token probability 0, ℓᵀ = −inf, would otherwise give an infinite advantage).
TEACHER_FLOOR = -20.0


def response_mask_of(response_mask: ArrayLike) -> Array:
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank(mask_BT, 2)
  return mask_BT.astype(bool)


def teacher_gap(logprob_teacher: ArrayLike, logprob_student: ArrayLike, mask_BT: Array,
                floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """δ[b,t] = max(ℓᵀ[b,t], floor) − ℓˢ[b,t] on valid tokens, 0 elsewhere ([B,T] float32)."""
  lt_BT = jnp.asarray(logprob_teacher, jnp.float32)
  ls_BT = jnp.asarray(logprob_student, jnp.float32)
  chex.assert_rank([lt_BT, ls_BT], 2)
  chex.assert_equal_shape([lt_BT, ls_BT, mask_BT])
  lt_BT = jnp.maximum(jnp.where(mask_BT, lt_BT, 0.0), jnp.asarray(floor, jnp.float32))
  ls_BT = jnp.where(mask_BT, ls_BT, 0.0)
  return jnp.where(mask_BT, lt_BT - ls_BT, 0.0)


class GrpoRows(NamedTuple):
  rows: ops.GroupRows  # values = reward, group_id, mask, valid
  adv: Array           # [B] GRPO advantage Â_b (0 on invalid rows, singletons, equal groups)


def grpo_rows(fn: str, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
              num_groups: int, group_size: int | None, *, group_std: str = "unbiased",
              eps: ArrayLike = 1e-6, valid: ArrayLike | None = None) -> GrpoRows:
  """Checks, row validity and Â_b = (R_b − μ_g)/(σ_g + ε) over the valid rows."""
  check_choice(fn, "group_std", group_std, GROUP_STDS)
  rows = ops.group_rows(fn, reward, group_id, num_groups, group_size,
                        response_mask=response_mask, valid=valid)
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  return GrpoRows(rows=rows, adv=adv_B)


def is_zero(x) -> bool:
  """True for a Python number equal to 0 (a static fact; traced values are never 'zero')."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def optional_grpo(fn: str, coef_name: str, coef, reward, group_id, mask_BT: Array,
                  num_groups: int | None, group_size: int | None, eps) -> Array | None:
  """Â_b [B] when `reward` is given, None when it is not (then `coef` must be 0)."""
  if reward is None:
    if not is_zero(coef):
      raise ValueError(f"{fn}: {coef_name}={coef!r} needs `reward` (and `group_id`, or "
                       "`group_size`)")
    return None
  if num_groups is None and group_size is not None:
    num_groups = mask_BT.shape[0] // group_size
  return grpo_rows(fn, reward, group_id, mask_BT, num_groups, group_size, eps=eps).adv
