"""Masked, group and turn primitives shared by every estimator and loss.

Everything here is a pure function of arrays, safe under `jit`, `vmap` and
sharding. Masked and degenerate entries give exact zeros, never NaN: divisions
are guarded with `jnp.maximum(count, 1)` and the unused branch of every
`jnp.where` is finite.

Numerical note: group and batch statistics are computed *shifted*: values are
first moved by a per-group pivot (the group maximum) or by a first-pass mean,
so that rewards such as [1000, 1000, 1000, 1000.01] keep their differences in
float32 instead of cancelling in a raw sum.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

Array = jax.Array
SingletonPolicy = Literal["zero", "raw"]


def _f32(x: ArrayLike) -> Array:
  return jnp.asarray(x, dtype=jnp.float32)


def _maskf(mask: ArrayLike | None, like: Array) -> Array:
  if mask is None:
    return jnp.ones(like.shape, jnp.float32)
  return jnp.broadcast_to(jnp.asarray(mask), like.shape).astype(jnp.float32)


# --------------------------------------------------------------------------
# Masked reductions.
# --------------------------------------------------------------------------


def masked_sum(x: ArrayLike, mask: ArrayLike | None = None, axis=None) -> Array:
  """Σ x·m over `axis`; masked entries (even NaN/inf ones) contribute exactly 0."""
  x = _f32(x)
  m = _maskf(mask, x)
  return jnp.sum(jnp.where(m > 0, x * m, 0.0), axis=axis)


def masked_mean(x: ArrayLike, mask: ArrayLike | None = None, axis=None) -> Array:
  """Σ x·m / max(Σ m, 1): 0 where the mask selects nothing."""
  x = _f32(x)
  m = _maskf(mask, x)
  return masked_sum(x, m, axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def masked_var(x: ArrayLike, mask: ArrayLike | None = None, axis=None,
               unbiased: bool = True) -> Array:
  """Masked variance (Bessel-corrected by default), two-pass for accuracy.

  Returns 0 when fewer than two (unbiased) or one (biased) entries are valid.
  """
  x = _f32(x)
  m = _maskf(mask, x)
  count = jnp.sum(m, axis=axis, keepdims=True)
  mean1 = masked_sum(x, m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)
  mean1 = jnp.expand_dims(mean1, axis) if axis is not None else mean1
  d = jnp.where(m > 0, x - mean1, 0.0)
  dmean = jnp.sum(d * m, axis=axis, keepdims=True) / jnp.maximum(count, 1.0)
  ss = jnp.sum(jnp.square(d - dmean) * m, axis=axis, keepdims=True)
  denom = count - 1.0 if unbiased else count
  var = jnp.where(denom > 0, ss / jnp.maximum(denom, 1.0), 0.0)
  return jnp.squeeze(var, axis) if axis is not None else jnp.squeeze(var)


def masked_whiten(x: ArrayLike, mask: ArrayLike | None = None, *,
                  shift_mean: bool = True, eps: float = 1e-8) -> Array:
  """Whitening over all valid entries (verl `masked_whiten`), zero outside the mask.

  y = (x − m)·(v + eps)^{-1/2}·M with m the masked mean and v the unbiased masked
  variance. With fewer than two valid entries the output is 0 (v is undefined).
  With `shift_mean=False` the mean is added back (scale only).
  """
  x = _f32(x)
  m = _maskf(mask, x)
  count = jnp.sum(m)
  mean1 = masked_mean(x, m)
  d = jnp.where(m > 0, x - mean1, 0.0)
  dmean = jnp.sum(d * m) / jnp.maximum(count, 1.0)
  centred = d - dmean
  var = jnp.sum(jnp.square(centred) * m) / jnp.maximum(count - 1.0, 1.0)
  y = centred * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    y = y + (mean1 + dmean)
  return jnp.where((m > 0) & (count > 1), y, 0.0)


def safe_sqrt(x: Array) -> Array:
  """sqrt with a finite (zero) gradient at 0, so all-equal groups differentiate."""
  pos = x > 0
  return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


# --------------------------------------------------------------------------
# Group statistics: [N,G] fast path and segment path.
# --------------------------------------------------------------------------


class GroupMoments(NamedTuple):
  """Per-group statistics, each of shape [num_groups] (or [N] on the fast path).

  `std` is the unbiased standard deviation (0 for groups with < 2 members).
  `pivot` is the shift used for the accurate computation.
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
  v = _f32(values)
  gid = jnp.asarray(group_id, jnp.int32)
  ok = (gid >= 0) & (gid < num_groups)
  if valid is not None:
    ok = ok & jnp.asarray(valid, bool)
  seg = jnp.where(ok, gid, num_groups)  # out-of-range goes to a dropped bucket
  okf = ok.astype(jnp.float32)
  ns = num_groups + 1
  count = jax.ops.segment_sum(okf, seg, ns)[:num_groups]
  pivot = jax.ops.segment_max(jnp.where(ok, v, -jnp.inf), seg, ns)[:num_groups]
  pivot = jnp.where(count > 0, pivot, 0.0)
  d = jnp.where(ok, v - pivot[jnp.clip(seg, 0, num_groups - 1)], 0.0)
  dsum = jax.ops.segment_sum(d, seg, ns)[:num_groups]
  dmean = dsum / jnp.maximum(count, 1.0)
  c = jnp.where(ok, d - dmean[jnp.clip(seg, 0, num_groups - 1)], 0.0)
  ss = jax.ops.segment_sum(c * c, seg, ns)[:num_groups]
  var = jnp.where(count > 1, ss / jnp.maximum(count - 1.0, 1.0), 0.0)
  return GroupMoments(count=count, mean=pivot + dmean, std=safe_sqrt(var))


def group_moments_dense(values_NG: ArrayLike,
                        valid_NG: ArrayLike | None = None) -> GroupMoments:
  """Fast path of `group_moments` for contiguous groups reshaped to [N,G]."""
  v = _f32(values_NG)
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
  return GroupMoments(count=count, mean=pivot + dmean, std=safe_sqrt(var))


def _centred(values: Array, group_id: Array, num_groups: int, valid: Array | None,
             group_size: int | None) -> tuple[Array, Array, Array]:
  """Returns (value − group mean, group std, group count), each per item [M].

  The centred value is computed from pivot-shifted deviations, never as
  `value − mean` of two large numbers.
  """
  v = _f32(values)
  ok = jnp.ones(v.shape, bool) if valid is None else jnp.asarray(valid, bool)
  if group_size is not None:
    vNG = v.reshape(-1, group_size)
    okNG = ok.reshape(-1, group_size)
    mom = group_moments_dense(vNG, okNG)
    pivot = jnp.max(jnp.where(okNG, vNG, -jnp.inf), axis=-1)
    pivot = jnp.where(mom.count > 0, pivot, 0.0)
    cen = (vNG - pivot[:, None]) - (mom.mean - pivot)[:, None]
    rep = lambda a: jnp.repeat(a, group_size, total_repeat_length=v.shape[0])
    return cen.reshape(-1), rep(mom.std), rep(mom.count)
  gid = jnp.asarray(group_id, jnp.int32)
  mom = group_moments(v, gid, num_groups, ok)
  safe = jnp.clip(gid, 0, num_groups - 1)
  inrange = (gid >= 0) & (gid < num_groups)
  # Recompute the pivot gather so that (v − pivot) − (mean − pivot) keeps precision.
  seg = jnp.where(ok & inrange, gid, num_groups)
  pivot = jax.ops.segment_max(jnp.where(ok & inrange, v, -jnp.inf), seg,
                              num_groups + 1)[:num_groups]
  pivot = jnp.where(mom.count > 0, pivot, 0.0)
  cen = (v - pivot[safe]) - (mom.mean - pivot)[safe]
  return cen, mom.std[safe], mom.count[safe]


def group_normalize(values: ArrayLike, group_id: ArrayLike | None = None,
                    num_groups: int | None = None, *, valid: ArrayLike | None = None,
                    scale: bool = True, eps: float = 1e-6,
                    singleton: SingletonPolicy = "zero",
                    group_size: int | None = None) -> Array:
  """Group z-score (P1/P6): (x − μ_g)/(σ_g + eps), or x − μ_g without `scale`.

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
  v = _f32(values)
  cen, std, count = _centred(v, group_id, num_groups, valid, group_size)
  out = cen / (std + eps) if scale else cen
  if singleton == "raw":
    out = jnp.where(count == 1, v, out)
  elif singleton == "zero":
    out = jnp.where(count == 1, 0.0, out)
  else:
    raise ValueError(f"singleton must be 'zero' or 'raw', got {singleton!r}")
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
  v = _f32(values)
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
# Sequence <-> token.
# --------------------------------------------------------------------------


def broadcast_to_tokens(values_B: ArrayLike, response_mask: ArrayLike) -> Array:
  """A[i,t] = a_i · M[i,t]: exact zeros outside the mask."""
  v = _f32(values_B)
  chex.assert_rank(v, 1)
  m = jnp.asarray(response_mask)
  chex.assert_rank(m, 2)
  return jnp.where(m.astype(bool), v[:, None], 0.0)


def sequence_lengths(response_mask: ArrayLike) -> Array:
  """|o_i| = Σ_t M[i,t] as float32 [B]."""
  return jnp.sum(jnp.asarray(response_mask).astype(jnp.float32), axis=-1)


def last_token_mask(response_mask: ArrayLike) -> Array:
  """[B,T] bool, True at the last valid token of each row (none for empty rows)."""
  m = jnp.asarray(response_mask).astype(bool)
  T = m.shape[-1]
  idx = jnp.where(m, jnp.arange(T, dtype=jnp.int32), -1)
  last = jnp.max(idx, axis=-1, keepdims=True)
  return m & (jnp.arange(T, dtype=jnp.int32)[None, :] == last)


def outcome_to_token_rewards(reward: ArrayLike, response_mask: ArrayLike) -> Array:
  """Places the scalar outcome on the last valid token of each row."""
  r = _f32(reward)
  return jnp.where(last_token_mask(response_mask), r[:, None], 0.0)


# --------------------------------------------------------------------------
# Linear recurrences over time that skip masked positions.
# --------------------------------------------------------------------------


# Block length of the two-level scan in `_reverse_linear_recurrence` (rows of >= 32² positions).
RECURRENCE_BLOCK = 32


def _reverse_linear_recurrence(x_BT: Array, coef_BT: Array) -> Array:
  """y_t = x_t + coef_t · y_{t+1} with y_T = 0, along the last axis.

  Short rows: a parallel associative scan (each position is the affine map
  y -> coef_t·y + x_t; O(log T) passes). Rows of RECURRENCE_BLOCK² positions and
  more: a two-level blocked scan, which XLA CPU runs 2-3x faster at B·T = 4M
  (benchmarks/estimators.py, GAE λ<1):
    1. inside every block of c positions, all blocks at once (a `lax.scan` of c
       steps over [..., T/c] slices): the local return assuming nothing after
       the block, and the product of the coefficients to the block's end;
    2. across blocks (a scan of T/c steps): the return entering each block;
    3. y = local + product · (return after the block).
  Same recurrence, different rounding order (products of coefficients are
  formed left to right inside a block).
  """
  t = x_BT.shape[-1]
  c = RECURRENCE_BLOCK
  if t < c * c:
    def compose(left, right):  # left = later position's accumulated map
      a_l, b_l = left
      a_r, b_r = right
      return a_l * a_r, b_r + a_r * b_l

    _, y = jax.lax.associative_scan(compose, (coef_BT, x_BT), reverse=True,
                                    axis=x_BT.ndim - 1)
    return y

  lead = x_BT.shape[:-1]
  nb = -(-t // c)
  pad = nb * c - t
  if pad:  # trailing positions with x = 0, coef = 1 leave every return unchanged
    widths = [(0, 0)] * (x_BT.ndim - 1) + [(0, pad)]
    x_BT = jnp.pad(x_BT, widths)
    coef_BT = jnp.pad(coef_BT, widths, constant_values=1.0)
  # [..., nb, c] -> [c, ..., nb]: step k of the scan handles offset k of every block.
  xk = jnp.moveaxis(x_BT.reshape(lead + (nb, c)), -1, 0)
  ak = jnp.moveaxis(coef_BT.reshape(lead + (nb, c)), -1, 0)

  def local(carry, xa):
    y, prod = carry
    x, a = xa
    y, prod = x + a * y, a * prod
    return (y, prod), (y, prod)

  zero = jnp.zeros(lead + (nb,), x_BT.dtype)
  _, (y_loc, prod) = jax.lax.scan(local, (zero, jnp.ones_like(zero)), (xk, ak), reverse=True)

  def across(after, yp):  # `after`: the return entering the block that follows
    y0, p0 = yp
    return y0 + p0 * after, after

  heads = (jnp.moveaxis(y_loc[0], -1, 0), jnp.moveaxis(prod[0], -1, 0))  # [nb, ...]
  _, after_blocks = jax.lax.scan(across, jnp.zeros(lead, x_BT.dtype), heads, reverse=True)
  y = y_loc + prod * jnp.moveaxis(after_blocks, 0, -1)[None]
  return jnp.moveaxis(y, 0, -1).reshape(lead + (nb * c,))[..., :t]


def discounted_reverse_cumsum(x: ArrayLike, mask: ArrayLike, gamma: ArrayLike = 1.0) -> Array:
  """G[t] = x[t] + γ·G[next valid t'], computed only over valid positions.

  Positions with mask 0 (padding, or observation tokens inside a multi-turn
  response) neither add to the return nor reset or discount it: the running
  return passes through them unchanged. The output is 0 at masked positions.

  Args:
    x: [B,T] per-token rewards (values at masked positions are ignored).
    mask: [B,T] bool, the positions that take part in the recurrence.
    gamma: discount, a scalar (may be a traced array, so vmap can sweep it).
  Returns:
    [B,T] float32 returns, zero where mask is 0.
  """
  x = _f32(x)
  m = jnp.asarray(mask).astype(bool)
  chex.assert_equal_shape([x, m])
  xs = jnp.where(m, x, 0.0)
  if isinstance(gamma, (int, float)) and gamma == 1.0:
    # Undiscounted: skipping masked positions is just a reverse cumulative sum.
    return jnp.where(m, jax.lax.cumsum(xs, axis=x.ndim - 1, reverse=True), 0.0)
  coef = jnp.where(m, _f32(gamma), 1.0)
  y = _reverse_linear_recurrence(xs, coef)
  return jnp.where(m, y, 0.0)


def next_valid_value(values: ArrayLike, mask: ArrayLike) -> Array:
  """v[next valid t' > t] for every t, 0 when none follows."""
  v = _f32(values)
  m = jnp.asarray(mask).astype(bool)
  T = v.shape[-1]
  idx = jnp.where(m, jnp.arange(T, dtype=jnp.int32), T)
  nxt = jax.lax.cummin(idx, axis=v.ndim - 1, reverse=True)
  nxt = jnp.concatenate([nxt[..., 1:], jnp.full(nxt.shape[:-1] + (1,), T, jnp.int32)], -1)
  padded = jnp.concatenate([v, jnp.zeros(v.shape[:-1] + (1,), v.dtype)], -1)
  return jnp.take_along_axis(padded, nxt, axis=-1)


# --------------------------------------------------------------------------
# Turns.
# --------------------------------------------------------------------------


def turn_reduce(x: ArrayLike, turn_id: ArrayLike, num_turns: int,
                mask: ArrayLike | None = None, reduce: Literal["sum", "mean", "count"] = "sum") -> Array:
  """Per-turn reduction [B,T] -> [B,K] using `turn_id` (−1 = outside any turn)."""
  x = _f32(x)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([x, tid])
  B = x.shape[0]
  ok = (tid >= 0) & (tid < num_turns)
  if mask is not None:
    ok = ok & jnp.asarray(mask, bool)
  seg = jnp.where(ok, jnp.arange(B, dtype=jnp.int32)[:, None] * num_turns + tid, B * num_turns)
  n = B * num_turns + 1
  if reduce == "count":
    return jax.ops.segment_sum(ok.astype(jnp.float32).reshape(-1), seg.reshape(-1), n)[:-1].reshape(B, num_turns)
  s = jax.ops.segment_sum(jnp.where(ok, x, 0.0).reshape(-1), seg.reshape(-1), n)[:-1].reshape(B, num_turns)
  if reduce == "sum":
    return s
  if reduce == "mean":
    c = jax.ops.segment_sum(ok.astype(jnp.float32).reshape(-1), seg.reshape(-1), n)[:-1].reshape(B, num_turns)
    return s / jnp.maximum(c, 1.0)
  raise ValueError(f"reduce must be 'sum', 'mean' or 'count', got {reduce!r}")


def turn_broadcast(x_BK: ArrayLike, turn_id: ArrayLike, mask: ArrayLike | None = None) -> Array:
  """[B,K] -> [B,T]: each token gets its turn's value, 0 outside turns / mask."""
  x = _f32(x_BK)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_rank([x, tid], 2)
  K = x.shape[1]
  ok = (tid >= 0) & (tid < K)
  if mask is not None:
    ok = ok & jnp.asarray(mask, bool)
  out = jnp.take_along_axis(x, jnp.clip(tid, 0, K - 1), axis=1)
  return jnp.where(ok, out, 0.0)
