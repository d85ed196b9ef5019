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


def format_flags(format_ok: ArrayLike | None, batch: int) -> Array:
  """[B] bool: the optional per-row `format_ok` (shape-checked), all True when None."""
  if format_ok is None:
    return jnp.ones(batch, bool)
  ok_B = jnp.asarray(format_ok).astype(bool)
  chex.assert_shape(ok_B, (batch,))
  return ok_B


def rows(fn: str, group_id, response_mask, num_groups, group_size, batch_values: Array,
         extra_valid: Array | None = None) -> ops.GroupRows:
  """`ops.group_rows` on a per-row score (rows also need `extra_valid`)."""
  return ops.group_rows(fn, batch_values, group_id, num_groups, group_size,
                        response_mask=response_mask, valid=extra_valid)


def group_advantages(fn: str, score_B: Array, rows_: ops.GroupRows, num_groups: int,
                     group_size: int | None, baseline: str, eps) -> Array:
  """Per-row score -> [B,T] advantages with a group baseline (`row_advantages` on the
  response tokens)."""
  return ops.broadcast_to_tokens(
      row_advantages(fn, score_B, rows_, num_groups, group_size, baseline, eps), rows_.mask)


def row_advantages(fn: str, score_B: Array, rows_: ops.GroupRows, num_groups: int,
                   group_size: int | None, baseline: str, eps) -> Array:
  """Per-row score -> [B] advantages with a group baseline.

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
  return jnp.where(valid_B, adv_B, 0.0)


def answer_likelihood_loss(*, logprob_answer: ArrayLike, answer_mask: ArrayLike,
                           answer_weight: ArrayLike) -> Array:
  """The reference answer's weighted negative log-likelihood on any subset of rows.

  ::

    L = −mean_b  w_b Σ_j m_{b,j} log π(a*_j | x, z_b, a*_{<j})

  the answer-token term of VeriFree (w = R, its reward) and JEPO (w = the group's
  self-normalised answer probabilities), which train log π(a* | x, z) besides the policy
  gradient on z. The runner adds it to every minibatch's loss with `logprob_answer`
  recomputed under the update's parameters (`TrainedLoss` with scores
  ("logprob_answer",)); `answer_weight` comes from the estimator's output over whole groups
  and carries no gradient.

  Args:
    logprob_answer: [B,A] float log-probs of the answer tokens (differentiated).
    answer_mask: [B,A] bool.
    answer_weight: [B] float w_b (0 on rows that take no part).

  Returns:
    The scalar loss.
  """
  w_B = jax.lax.stop_gradient(jnp.asarray(answer_weight, jnp.float32))
  chex.assert_rank(w_B, 1)
  lp_BA, _, _ = answer_inputs(logprob_answer, answer_mask, jnp.shape(w_B)[0])
  return -jnp.mean(w_B * jnp.sum(lp_BA, axis=-1))
