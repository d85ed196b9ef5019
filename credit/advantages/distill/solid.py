"""SOLID: the majority cluster of solver answers as pseudo-reference, plus self-distillation."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.distill._teach import (TEACHER_FLOOR, response_mask_of, teacher_gap)
from credit.ops.baselines import sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["solid_advantages", "solid_pseudo_labels", "SolidLabels"]

_PAPER = ("SOLID: solver-artifact majority as pseudo-reference with dense self-distillation "
          "for optimization modeling without gold answers, arXiv preprint")


class SolidLabels(NamedTuple):
  """Per-row majority-vote results ([B] each).

  Attributes:
    label: float32 pseudo-label y_b (1: in the representative's cluster of a group with a
      majority; 0 otherwise, failed executions included).
    support: float32 number of valid answers of the group within tolerance of the row's
      answer (itself included; 0 for a failed execution or an invalid row).
    majority: bool, the row's group has a representative with support ≥ `min_support`.
  """
  label: Array
  support: Array
  majority: Array


def solid_pseudo_labels(*, answer_value: ArrayLike, group_id: ArrayLike | None,
                        response_mask: ArrayLike, num_groups: int,
                        group_size: int | None = None, tol: ArrayLike = 1e-6,
                        min_support: ArrayLike = 2) -> SolidLabels:
  """Tolerance clusters of the answers inside each group and the majority pseudo-label.

  adj_ij = abs(o_i − o_j) ≤ tol · max(1, abs(o_j)) over pairs of valid answers of the same
  group; support_i = Σ_j adj_ij; the representative is the row of largest support (the
  lowest batch index among rows of one cluster); y_i = adj_{rep,i}, kept only when
  support_rep ≥ `min_support` and no row outside the representative's cluster has as much
  support (two tied clusters: no majority, so the labels do not depend on the row order).
  Computed with a masked [B,B] comparison (segment path) or [N,G,G] blocks (fast path).
  See `solid_advantages`.
  """
  mask_BT = response_mask_of(response_mask)
  o_B = jnp.asarray(answer_value, jnp.float32)
  chex.assert_shape(o_B, mask_BT.shape[:1])
  rows = ops.group_rows("solid_pseudo_labels", jnp.zeros(mask_BT.shape[:1]), group_id,
                        num_groups, group_size, response_mask=mask_BT)
  ok_B = rows.valid & jnp.isfinite(o_B)
  o_B = jnp.where(ok_B, o_B, 0.0)
  nb = o_B.shape[0]
  if group_size is not None:  # [N,G] blocks: rows of one block share the group
    shape = (nb // group_size, group_size)
    grp_NMM = jnp.ones(shape + (group_size,), bool)
  else:                       # one block of B rows, same-group pairs masked
    shape = (1, nb)
    grp_NMM = (rows.group_id[:, None] == rows.group_id[None, :])[None]
  o_NM, ok_NM, valid_NM = (x.reshape(shape) for x in (o_B, ok_B, rows.valid))
  grp_NMM = grp_NMM & valid_NM[:, :, None] & valid_NM[:, None, :]     # same group, both rows valid
  same_NMM = grp_NMM & ok_NM[:, :, None] & ok_NM[:, None, :]          # ... both answers valid
  gap_NMM = jnp.abs(o_NM[:, :, None] - o_NM[:, None, :])
  tol_NMM = jnp.asarray(tol, jnp.float32) * jnp.maximum(1.0, jnp.abs(o_NM))[:, None, :]
  adj_NMM = same_NMM & (gap_NMM <= tol_NMM)                           # adj[i, j]
  support_NM = jnp.sum(adj_NMM, axis=-1).astype(jnp.float32)
  best_NM = jnp.max(jnp.where(same_NMM, support_NM[:, None, :], 0.0), axis=-1)
  top_NM = ok_NM & (support_NM == best_NM)
  m = shape[1]
  before_MM = jnp.arange(m)[None, :] < jnp.arange(m)[:, None]         # [i, j]: j < i
  earlier_NM = jnp.any(same_NMM & top_NM[:, None, :] & before_MM[None], axis=-1)
  rep_NM = top_NM & ~earlier_NM
  # Two clusters tied for the most support: no majority (a row-order tie-break would make
  # the labels depend on the order of the rows).
  contested_NM = jnp.any(same_NMM & top_NM[:, None, :] & ~adj_NMM, axis=-1)
  strong_NM = (rep_NM & ~contested_NM
               & (support_NM >= jnp.asarray(min_support, jnp.float32)))
  majority_NM = jnp.any(grp_NMM & strong_NM[:, None, :], axis=-1)
  # y_i = adj[rep, i] for the group's representative.
  label_NM = jnp.any(jnp.swapaxes(adj_NMM, -1, -2) & strong_NM[:, None, :], axis=-1)
  flat = lambda x: x.reshape(nb)
  return SolidLabels(label=flat(label_NM).astype(jnp.float32), support=flat(support_NM),
                     majority=flat(majority_NM))


@register_estimator(
    "solid", needs=("answer_value", "group_id", "response_mask", "logprob_old",
                    "logprob_teacher"),
    paper=_PAPER, static_argnames=("num_groups", "group_size"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def solid_advantages(*, answer_value: ArrayLike, group_id: ArrayLike | None,
                     response_mask: ArrayLike, logprob_old: ArrayLike,
                     logprob_teacher: ArrayLike, num_groups: int,
                     group_size: int | None = None, coef: ArrayLike = 1.0,
                     tol: ArrayLike = 1e-6, min_support: ArrayLike = 2,
                     eps: ArrayLike = 1e-6, teacher_floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """SOLID: GRPO on a majority-vote pseudo-reward plus self-distillation of the minority.

  Without gold answers, each rollout's program is executed, the objective values of a
  prompt's rollouts are clustered, and the majority cluster is taken as correct; the
  minority is distilled toward the policy conditioned on the majority artifact::

    y_i = 1[i in the majority cluster]                          (`solid_pseudo_labels`)
    A[b,t] = Â_b(y) + λ · M_g · (1 − y_b) · (max(ℓᵀ[b,t], −20) − ℓˢ[b,t])

  with o = `answer_value` (NaN when execution failed: no answer, reward 0, still a rollout
  of its group), Â GRPO of the pseudo-reward, M_g = 1 when the group has a majority
  (support ≥ s_min), ℓᵀ = `logprob_teacher` the policy with the majority artifact in
  context and ℓˢ = `logprob_old`. SOLID does not read `reward`. The output carries no
  gradient.

  Paper: "SOLID: solver-artifact majority as pseudo-reference with dense
  self-distillation" (arXiv preprint). The abstract gives the idea but no equation: the
  formula, tol = 1e-6 (relative), s_min = 2, λ = 1 are this library's reading; a tie
  between two clusters gives no majority, so permuting a group's rows permutes the
  advantages.

  Args:
    answer_value: [B] float objective value of each rollout's program, NaN when it failed.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour) log-prob of the sampled token, ℓˢ.
    logprob_teacher: [B,T] float the policy conditioned on the majority artifact, ℓᵀ.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    coef: λ, weight of the self-distillation term.
    tol: relative tolerance of the answer clusters.
    min_support: s_min, the representative's least support for a majority.
    eps: added to the group std.
    teacher_floor: lower clamp of ℓᵀ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> o = np.array([10., 10.0000001, 12., np.nan, 10.])
    >>> lab = solid_pseudo_labels(answer_value=o, group_id=np.zeros(5, int),
    ...                           response_mask=np.ones((5, 1), bool), num_groups=1)
    >>> np.asarray(lab.support).tolist(), np.asarray(lab.label).tolist()
    ([3.0, 3.0, 1.0, 0.0, 3.0], [1.0, 1.0, 0.0, 0.0, 1.0])
    >>> a = solid_advantages(answer_value=o, group_id=np.zeros(5, int),
    ...     response_mask=np.ones((5, 1), bool), logprob_old=np.zeros((5, 1)),
    ...     logprob_teacher=np.zeros((5, 1)), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 6).tolist()
    [0.730295, 0.730295, -1.095443, -1.095443, 0.730295]
  """
  mask_BT = response_mask_of(response_mask)
  delta_BT = teacher_gap(logprob_teacher, logprob_old, mask_BT, teacher_floor)
  lab = solid_pseudo_labels(answer_value=answer_value, group_id=group_id,
                            response_mask=mask_BT, num_groups=num_groups,
                            group_size=group_size, tol=tol, min_support=min_support)
  rows = ops.group_rows("solid_advantages", lab.label, group_id, num_groups, group_size,
                        response_mask=mask_BT)
  adv_B = sequence_advantage(lab.label, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, eps=eps)
  gate_B = jnp.asarray(coef, jnp.float32) * (rows.valid & lab.majority) * (1.0 - lab.label)
  adv_BT = adv_B[:, None] + gate_B[:, None] * delta_BT
  return jax.lax.stop_gradient(jnp.where(mask_BT, adv_BT, 0.0))
