"""Shared pieces of the step-level distillation estimators (SOD, SSPO, PCSD, PBSD, VERPO).

Private (not imported as a method by `credit/_discover.py`); estimators import it explicitly.

* `clean_logprobs`: sampled-token log-probs under the mask, clamped from below at
  `LOGPROB_FLOOR` = −20 (a teacher giving the student's token probability 0, −inf or
  −1e9, would otherwise dominate every difference; the same floor as OPD's), exact 0
  outside the mask (NaN there never reaches an output).
* `steps_from_mask`: step = maximal run of consecutive 1s of the response mask (the
  agent's steps of a multi-turn rollout whose tool/observation tokens are masked):
  start[t] = m[t] ∧ ¬m[t−1], step_id = cumsum(start) − 1 on valid tokens, −1 elsewhere.
* `clip_steps`: `step_id` of valid tokens clipped to the static S − 1, −1 elsewhere:
  steps beyond the static count are merged into the last step (documented by each method).
* `step_means`: per-step mean and token count of a [B,T] array ([B,S] each) through
  `credit.ops.turn_reduce`.
* `grpo_rows`: the GRPO sequence advantage Â_b of the rows (`sequence_advantage`) and the
  checked response mask.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.ops.baselines import GROUP_STDS, sequence_advantage

Array = jax.Array

LOGPROB_FLOOR = -20.0


def clean_logprobs(response_mask: ArrayLike, *logprobs: ArrayLike,
                   floor: float = LOGPROB_FLOOR) -> tuple[Array, ...]:
  """(mask_BT, lp_BT, ...): bool mask and each [B,T] log-prob clamped at `floor`, 0 off-mask."""
  mask_BT = jnp.asarray(response_mask)
  arrays = [jnp.asarray(x, jnp.float32) for x in logprobs]
  chex.assert_rank([mask_BT] + arrays, 2)
  chex.assert_equal_shape([mask_BT] + arrays)
  mask_BT = mask_BT.astype(bool)
  return (mask_BT,) + tuple(jnp.where(mask_BT, jnp.maximum(x, floor), 0.0) for x in arrays)


def shift_right(x_BT: Array, j: int, fill) -> Array:
  """x[:, t − j] at position t (static j ≥ 0), `fill` for t < j."""
  if j == 0:
    return x_BT
  T = x_BT.shape[1]
  pad = jnp.full((x_BT.shape[0], min(j, T)), fill, x_BT.dtype)
  return jnp.concatenate([pad, x_BT[:, :max(T - j, 0)]], axis=1)


def steps_from_mask(response_mask: ArrayLike, num_steps: int) -> Array:
  """[B,T] int32 step of each valid token (runs of 1s of the mask), −1 elsewhere.

  Runs after the `num_steps`-th are merged into step `num_steps − 1`.

  >>> import numpy as np
  >>> steps_from_mask(np.array([[1, 1, 0, 1, 0, 1, 1]], bool), 2).tolist()
  [[0, 0, -1, 1, -1, 1, 1]]
  """
  check_int("steps_from_mask", "num_steps", num_steps)
  mask_BT = jnp.asarray(response_mask).astype(bool)
  chex.assert_rank(mask_BT, 2)
  start_BT = mask_BT & ~shift_right(mask_BT, 1, False)
  sid_BT = ops.prefix_sum(start_BT) - 1   # exact int32 counts
  return jnp.where(mask_BT, jnp.minimum(sid_BT, num_steps - 1), -1)


def clip_steps(step_id: ArrayLike, response_mask: ArrayLike, num_steps: int) -> Array:
  """`step_id` on valid tokens with ids ≥ S merged into S − 1; −1 off-mask or outside steps."""
  check_int("clip_steps", "num_steps", num_steps)
  sid_BT = jnp.asarray(step_id)
  mask_BT = jnp.asarray(response_mask).astype(bool)
  chex.assert_type(sid_BT, int)
  chex.assert_equal_shape([sid_BT, mask_BT])
  sid_BT = sid_BT.astype(jnp.int32)
  return jnp.where(mask_BT & (sid_BT >= 0), jnp.minimum(sid_BT, num_steps - 1), -1)


def step_means(x_BT: Array, step_id_BT: Array, num_steps: int) -> tuple[Array, Array]:
  """(mean [B,S], count [B,S]) of x over the tokens of each step (`step_id` ≥ 0)."""
  mean_BS = ops.turn_reduce(x_BT, step_id_BT, num_steps, reduce="mean")
  count_BS = ops.turn_reduce(x_BT, step_id_BT, num_steps, reduce="count")
  return mean_BS, count_BS


def grpo_rows(fn: str, reward: ArrayLike, group_id: ArrayLike | None,
              response_mask: ArrayLike, num_groups: int, group_size: int | None,
              group_std: str, eps: ArrayLike) -> tuple[ops.GroupRows, Array]:
  """(rows, Â_b [B]): the checked rows (`ops.group_rows`) and their GRPO advantage."""
  check_choice(fn, "group_std", group_std, GROUP_STDS)
  rows = ops.group_rows(fn, reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  return rows, adv_B
