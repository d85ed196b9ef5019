"""Shared pieces of the likelihood-reward estimators (log-prob, VeriFree, JEPO, RLPR, FLR):
answer-token inputs and the group baseline that turns a per-row reward into advantages."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice

Array = jax.Array

BASELINES = ("rloo", "grpo")


def answer_inputs(logprob_answer: ArrayLike, answer_mask: ArrayLike,
                  batch: int) -> tuple[Array, Array, Array]:
  """(log-probs [B,A] with 0 outside the mask, mask [B,A] bool, row has an answer [B])."""
  lp_BA = jnp.asarray(logprob_answer, jnp.float32)
  m_BA = jnp.asarray(answer_mask)
  chex.assert_rank([lp_BA, m_BA], 2)
  chex.assert_equal_shape([lp_BA, m_BA])
  chex.assert_axis_dimension(lp_BA, 0, batch)
  m_BA = m_BA.astype(bool)
  return jnp.where(m_BA, lp_BA, 0.0), m_BA, jnp.any(m_BA, axis=-1)


def rows(fn: str, group_id, response_mask, num_groups, group_size, batch_values: Array,
         extra_valid: Array | None = None) -> ops.GroupRows:
  """`ops.group_rows` on a per-row score (rows also need `extra_valid`)."""
  return ops.group_rows(fn, batch_values, group_id, num_groups, group_size,
                        response_mask=response_mask, valid=extra_valid)


def group_advantages(fn: str, score_B: Array, rows_: ops.GroupRows, num_groups: int,
                     group_size: int | None, baseline: str, eps) -> Array:
  """Per-row score -> [B,T] advantages with a group baseline.

  "rloo": R_i − mean_{j≠i} R_j = K/(K−1)(R_i − μ_g); "grpo": (R_i − μ_g)/(σ_g + eps) with
  the unbiased std. Singleton groups, invalid rows and all-equal groups give exact 0.
  """
  check_choice(fn, "baseline", baseline, BASELINES)
  valid_B = rows_.valid
  score_B = jnp.where(valid_B, score_B, 0.0)
  if baseline == "grpo":
    adv_B = ops.group_normalize(score_B, rows_.group_id, num_groups, valid=valid_B, eps=eps,
                                group_size=group_size)
  else:
    cen_B = ops.group_normalize(score_B, rows_.group_id, num_groups, valid=valid_B,
                                scale=False, group_size=group_size)
    n_B = ops.group_count_rows(rows_.group_id, valid_B, num_groups, group_size)
    adv_B = cen_B * n_B / jnp.maximum(n_B - 1.0, 1.0)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), rows_.mask)
