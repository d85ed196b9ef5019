"""Group statistics: the contiguous [N,G] fast path and the segment path.

Every group function takes `num_groups` (static segment count, general path) and/or
`group_size` (static G: rows are contiguous groups, reshaped to [N,G]); both paths give
the same numbers. Items whose group id lies outside [0, num_groups) or that are not
`valid` take no part in any statistic.

Numerical note: statistics are computed *shifted*: values are first moved by a per-group
pivot (the group maximum), so that rewards such as [1000, 1000, 1000, 1000.01] keep their
differences in float32 instead of cancelling in a raw sum.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice, check_int
from credit.ops._cast import as_f32
from credit.ops.masked import safe_sqrt

Array = jax.Array
SingletonPolicy = Literal["zero", "raw"]
SINGLETONS = ("zero", "raw")

__all__ = ["SingletonPolicy", "SINGLETONS", "GroupMoments", "GroupRows", "group_moments",
           "group_moments_dense", "group_normalize", "group_sum", "gather_groups",
           "group_rows", "group_reduce_rows", "group_count_rows", "group_moments_rows"]


class GroupMoments(NamedTuple):
  """Per-group statistics, each of shape [num_groups] (or [N] on the fast path).

  `count` is the number of valid items; `std` the unbiased standard deviation (0 for
  groups with < 2 members).
  """
  count: Array
  mean: Array
  std: Array


def group_moments(values: ArrayLike, group_id: ArrayLike, num_groups: int,
                  valid: ArrayLike | None = None) -> GroupMoments:
  """Count, mean and unbiased std per group with segment sums (general path).

  Args:
    values: [M] float values (one per item: response, turn, step...).
    group_id: [M] int32 group of each item in [0, num_groups). Items whose id
      is outside that range are ignored.
    num_groups: static number of segments.
    valid: optional [M] bool; invalid items are excluded from the statistics.
  """
  return _segment_stats(values, group_id, num_groups, valid)[0]


def _segment_stats(values: ArrayLike, group_id: ArrayLike, num_groups: int,
                   valid: ArrayLike | None) -> tuple[GroupMoments, Array]:
  """`group_moments` and each item's value − its group mean [M] (0 where not taken part),
  the deviation the variance is summed from."""
  v = as_f32(values)
  gid = jnp.asarray(group_id, jnp.int32)
  ok = (gid >= 0) & (gid < num_groups)
  if valid is not None:
    ok = ok & jnp.asarray(valid, bool)
  seg = jnp.where(ok, gid, num_groups)  # out-of-range goes to a dropped bucket
  okf = ok.astype(jnp.float32)
  ns = num_groups + 1
  safe = jnp.clip(seg, 0, num_groups - 1)
  count = jax.ops.segment_sum(okf, seg, ns)[:num_groups]
  pivot = jax.ops.segment_max(jnp.where(ok, v, -jnp.inf), seg, ns)[:num_groups]
  pivot = jnp.where(count > 0, pivot, 0.0)
  d = jnp.where(ok, v - pivot[safe], 0.0)
  dsum = jax.ops.segment_sum(d, seg, ns)[:num_groups]
  dmean = dsum / jnp.maximum(count, 1.0)
  c = jnp.where(ok, d - dmean[safe], 0.0)
  ss = jax.ops.segment_sum(c * c, seg, ns)[:num_groups]
  var = jnp.where(count > 1, ss / jnp.maximum(count - 1.0, 1.0), 0.0)
  return GroupMoments(count=count, mean=pivot + dmean, std=safe_sqrt(var)), c


def group_moments_dense(values_NG: ArrayLike,
                        valid_NG: ArrayLike | None = None) -> GroupMoments:
  """Fast path of `group_moments` for contiguous groups reshaped to [N,G]."""
  return _dense_stats(values_NG, valid_NG)[0]


def _dense_stats(values_NG: ArrayLike,
                 valid_NG: ArrayLike | None) -> tuple[GroupMoments, Array]:
  """`group_moments_dense` and each item's value − its group mean [N,G] (0 where invalid)."""
  v = as_f32(values_NG)
  ok = jnp.ones(v.shape, bool) if valid_NG is None else jnp.asarray(valid_NG, bool)
  okf = ok.astype(jnp.float32)
  count = jnp.sum(okf, axis=-1)
  pivot = jnp.max(jnp.where(ok, v, -jnp.inf), axis=-1)
  pivot = jnp.where(count > 0, pivot, 0.0)
  d = jnp.where(ok, v - pivot[..., None], 0.0)
  dmean = jnp.sum(d, axis=-1) / jnp.maximum(count, 1.0)
  c = jnp.where(ok, d - dmean[..., None], 0.0)
  ss = jnp.sum(c * c, axis=-1)
  var = jnp.where(count > 1, ss / jnp.maximum(count - 1.0, 1.0), 0.0)
  return GroupMoments(count=count, mean=pivot + dmean, std=safe_sqrt(var)), c


def _centred(values: Array, group_id: Array, num_groups: int, valid: Array | None,
             group_size: int | None) -> tuple[Array, Array, Array]:
  """Returns (value − group mean, group std, group count), each per item [M].

  The centred value is the deviation the variance is summed from (pivot-shifted, never
  `value − mean` of two large numbers), so σ and it come from one computation: a group of
  equal values gets exactly 0 and σ = 0 together.
  """
  v = as_f32(values)
  ok = jnp.ones(v.shape, bool) if valid is None else jnp.asarray(valid, bool)
  if group_size is not None:
    mom, cen = _dense_stats(v.reshape(-1, group_size), ok.reshape(-1, group_size))
    rep = lambda a: jnp.repeat(a, group_size, total_repeat_length=v.shape[0])
    return cen.reshape(-1), rep(mom.std), rep(mom.count)
  gid = jnp.asarray(group_id, jnp.int32)
  mom, cen = _segment_stats(v, gid, num_groups, ok)
  safe = jnp.clip(gid, 0, num_groups - 1)
  return cen, mom.std[safe], mom.count[safe]


def group_normalize(values: ArrayLike, group_id: ArrayLike | None = None,
                    num_groups: int | None = None, *, valid: ArrayLike | None = None,
                    scale: bool = True, eps: float = 1e-6,
                    singleton: SingletonPolicy = "zero",
                    group_size: int | None = None) -> Array:
  """Group z-score: (x − μ_g)/(σ_g + eps), or x − μ_g without `scale`.

  Args:
    values: [M] one value per item.
    group_id: [M] int32 group ids in [0, num_groups); ignored on the fast path.
    num_groups: static segment count (general path).
    valid: optional [M] bool; invalid items get 0 and are not in the statistics.
    scale: divide by the unbiased group std plus `eps` (GRPO) or not (Dr.GRPO).
    eps: added to σ, not to the variance, so all-equal groups give exactly 0.
    singleton: "zero" gives 0 to a group with one valid item; "raw" returns the
      raw value (verl parity: μ=0, σ=1).
    group_size: static G for the contiguous fast path ([N,G] reshape). When set,
      `group_id`/`num_groups` are not used.

  Returns:
    [M] float32 normalised values; exact zeros for invalid items.
  """
  if group_size is None and num_groups is None:
    raise ValueError("group_normalize needs num_groups (segment path) or group_size (fast path)")
  check_choice("group_normalize", "singleton", singleton, SINGLETONS)
  v = as_f32(values)
  cen, std, count = _centred(v, group_id, num_groups, valid, group_size)
  out = cen / (std + eps) if scale else cen
  out = jnp.where(count == 1, v if singleton == "raw" else 0.0, out)
  ok = count > 0
  if group_size is None:
    gid = jnp.asarray(group_id, jnp.int32)
    ok = ok & (gid >= 0) & (gid < num_groups)
  if valid is not None:
    ok = ok & jnp.asarray(valid, bool)
  return jnp.where(ok, out, 0.0)


def group_sum(values: ArrayLike, group_id: ArrayLike, num_groups: int,
              valid: ArrayLike | None = None) -> Array:
  """Per-group sums [num_groups] with invalid / out-of-range items dropped."""
  v = as_f32(values)
  gid = jnp.asarray(group_id, jnp.int32)
  ok = (gid >= 0) & (gid < num_groups)
  if valid is not None:
    ok = ok & jnp.asarray(valid, bool)
  seg = jnp.where(ok, gid, num_groups)
  return jax.ops.segment_sum(jnp.where(ok, v, 0.0), seg, num_groups + 1)[:num_groups]


def gather_groups(per_group: ArrayLike, group_id: ArrayLike) -> Array:
  """per_group[group_id] with out-of-range ids clipped (callers mask them)."""
  per_group = jnp.asarray(per_group)
  return per_group[jnp.clip(jnp.asarray(group_id, jnp.int32), 0, per_group.shape[0] - 1)]


# --------------------------------------------------------------------------
# Row-level group estimators: one value per response [B].
# --------------------------------------------------------------------------


class GroupRows(NamedTuple):
  """A group estimator's per-row inputs after the shared checks (`group_rows`).

  values: [B] float32 per-row values (the reward, a filter metric, ...).
  group_id: [B] int32 group of each row (row // group_size when no ids were given).
  mask: [B,T] bool response mask, or None when `group_rows` got no `response_mask`.
  valid: [B] bool rows that take part in the statistics: a non-empty response (and
    `valid`, when given); on the segment path also a group id in [0, num_groups).
  """
  values: Array
  group_id: Array
  mask: Array | None
  valid: Array


def group_rows(fn: str, values: ArrayLike, group_id: ArrayLike | None, num_groups: int,
               group_size: int | None = None, *, response_mask: ArrayLike | None = None,
               valid: ArrayLike | None = None) -> GroupRows:
  """The preamble every group estimator starts with: arrays, shape asserts, static checks,
  group ids and the per-row validity mask.

  Invalid rows (empty responses, rows outside `valid`, out-of-range group ids on the segment
  path) get exact zeros from the estimators and take no part in any group or batch
  statistic, so masking a row out equals slicing it away.

  Args:
    fn: name of the calling function, for error messages.
    values: [B] per-row values.
    group_id: [B] integer group ids, or None on the fast path (rows are then contiguous
      groups of `group_size`).
    num_groups: static number of groups (a Python int >= 1).
    group_size: static G of the contiguous fast path ([N,G] reshape); None for the
      segment path. B must be a multiple of G.
    response_mask: optional [B,T] mask; a row is valid when it selects a token.
    valid: optional [B] bool restricting the valid rows further.

  Raises:
    ValueError: bad `num_groups` / `group_size`, or no `group_id` on the segment path.
  """
  values_B = jnp.asarray(values, jnp.float32)
  chex.assert_rank(values_B, 1)
  batch = values_B.shape[0]
  mask_BT = None
  valid_B = jnp.ones((batch,), bool)
  if response_mask is not None:
    mask_BT = jnp.asarray(response_mask)
    chex.assert_rank(mask_BT, 2)
    chex.assert_equal_shape_prefix([values_B, mask_BT], 1)
    mask_BT = mask_BT.astype(bool)
    valid_B = jnp.any(mask_BT, axis=-1)
  if valid is not None:
    extra_B = jnp.asarray(valid, bool)
    chex.assert_shape(extra_B, (batch,))
    valid_B = valid_B & extra_B
  check_int(fn, "num_groups", num_groups)
  if group_size is not None:
    check_int(fn, "group_size", group_size)
    if batch % group_size:
      raise ValueError(f"{fn}: batch size {batch} is not a multiple of group_size={group_size}")
  if group_id is None:
    if group_size is None:
      raise ValueError(f"{fn}: group_id is required on the segment path (group_size=None)")
    gid_B = jnp.arange(batch, dtype=jnp.int32) // group_size
  else:
    gid_B = jnp.asarray(group_id)
    chex.assert_rank(gid_B, 1)
    chex.assert_type(gid_B, int)
    chex.assert_equal_shape([gid_B, values_B])
    gid_B = gid_B.astype(jnp.int32)
    if group_size is None:
      valid_B = valid_B & (gid_B >= 0) & (gid_B < num_groups)
  return GroupRows(values=values_B, group_id=gid_B, mask=mask_BT, valid=valid_B)


_FILL = {"sum": 0.0, "max": -jnp.inf, "min": jnp.inf}
_SEGMENT = {"sum": jax.ops.segment_sum, "max": jax.ops.segment_max,
            "min": jax.ops.segment_min}


def group_reduce_rows(x_B: ArrayLike, group_id: ArrayLike, valid: ArrayLike, num_groups: int,
                      group_size: int | None, op: Literal["sum", "max", "min"]) -> Array:
  """For every row, `op` over the valid rows of its group ([B] -> [B]).

  Invalid rows read an unspecified value; callers mask them. Fast path: a reshape to
  [N,G]; segment path: a segment reduction with one extra dropped bucket for invalid rows.
  """
  check_choice("group_reduce_rows", "op", op, _FILL)
  valid_B = jnp.asarray(valid, bool)
  xv = jnp.where(valid_B, jnp.asarray(x_B), _FILL[op])
  if group_size is not None:
    red = getattr(jnp, op)(xv.reshape(-1, group_size), axis=1)
    return jnp.broadcast_to(red[:, None], (red.shape[0], group_size)).reshape(-1)
  seg = jnp.where(valid_B, jnp.asarray(group_id, jnp.int32), num_groups)
  return _SEGMENT[op](xv, seg, num_groups + 1)[seg]


def group_count_rows(group_id: ArrayLike, valid: ArrayLike, num_groups: int,
                     group_size: int | None) -> Array:
  """For every row, the number of valid rows in its group (float32 [B])."""
  valid_B = jnp.asarray(valid, bool)
  return group_reduce_rows(valid_B.astype(jnp.float32), group_id, valid_B, num_groups,
                           group_size, "sum")


def group_moments_rows(values: ArrayLike, group_id: ArrayLike, valid: ArrayLike,
                       num_groups: int, group_size: int | None) -> GroupMoments:
  """`group_moments` (or `group_moments_dense`) gathered back to rows: count, mean,
  unbiased std, each [B]."""
  if group_size is not None:
    mom = group_moments_dense(as_f32(values).reshape(-1, group_size),
                              jnp.asarray(valid, bool).reshape(-1, group_size))
    rep = lambda a: jnp.broadcast_to(a[:, None], (a.shape[0], group_size)).reshape(-1)
  else:
    mom = group_moments(values, group_id, num_groups, valid)
    rep = lambda a: gather_groups(a, group_id)
  return GroupMoments(count=rep(mom.count), mean=rep(mom.mean), std=rep(mom.std))
