"""Exact order statistics of the valid entries of a float32 array, without a sort.

A radix select on the float's order-preserving uint32 key: one histogram (a scatter-add)
of the top 16 key bits over every valid entry, then one histogram of the low 16 bits of
the entries whose top bits match the bucket found. Two passes over the data for any
static number of ranks (the second pass serves every rank at once), against a full
`jnp.sort`, which XLA CPU runs ~30x slower at 4M entries.

Order: that of `jnp.sort` / stable `jnp.argsort` (JAX's total order with −0 = +0 and
every NaN equal, after +inf). The key canonicalises −0 to +0, so an order statistic that
is a zero comes back as +0.0 where a sort might return −0.0 (equal values).

  masked_order_statistics  the k-th smallest valid entries (ranks traced, count static);
  masked_quantiles         numpy `method="linear"` quantiles of the valid entries;
  smallest_k_mask          the k smallest valid entries as a mask, ties by flat index
                           (a stable argsort's rank < k);
  row_smallest_k(_mask)    the same per row of a [B,R] array with its own k (a binary
                           search on the key: 32 compare-and-count passes, no histogram).
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

Array = jax.Array

__all__ = ["masked_order_statistics", "masked_quantiles", "smallest_k_mask", "row_smallest_k",
           "row_smallest_k_mask"]

_DIGIT_BITS = 16
_BUCKETS = 1 << _DIGIT_BITS
_LOW = _BUCKETS - 1
_BLOCK = 256
_TRI = (np.arange(_BLOCK)[:, None] <= np.arange(_BLOCK)[None, :]).astype(np.int32)


def _sort_key(x: Array) -> Array:
  """float32 -> uint32 whose unsigned order is `lax.sort`'s order of the floats."""
  x = jnp.where(x == 0, jnp.float32(0.0), x)            # −0 -> +0 (the sort's tie)
  x = jnp.where(jnp.isnan(x), jnp.float32(jnp.nan), x)  # one NaN, last
  bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
  negative = (bits >> 31) != 0
  return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _key_to_float(key: Array) -> Array:
  bits = jnp.where((key >> 31) != 0, key & jnp.uint32(0x7FFFFFFF), ~key)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _sum_last(x: Array) -> Array:
  """Σ over the last axis of an int32 array, as a dot: XLA CPU calls a library matmul
  instead of generating (and compiling, ~0.03 s each) a tree of reduction kernels."""
  return jnp.dot(x, np.ones(x.shape[-1], np.int32), preferred_element_type=jnp.int32)


def _locate(count_JL: Array, rank_J: Array) -> tuple[Array, Array]:
  """Index of the bucket holding 0-based `rank` in the concatenation of the buckets, and
  the count before that bucket, for each rank; `count_JL` is [J,L] or [1,L] (shared) int32.

  Two levels for L > 256: the block of 256 buckets from the block totals, then the bucket
  inside it; each level's prefix sums are a triangular int32 matmul, as XLA's cumsum costs
  ~0.4 s of compile time each. Needs 0 ≤ rank < the row's total (otherwise the index is
  clamped to the last bucket and the count is meaningless).
  """
  num, length = count_JL.shape
  if length > _BLOCK:
    blocks = -(-length // _BLOCK)
    count_JKC = jnp.pad(count_JL, ((0, 0), (0, blocks * _BLOCK - length))).reshape(
        num, blocks, _BLOCK)
    block_J, before_J = _locate(_sum_last(count_JKC), rank_J)
    if num == 1:
      row_JC = count_JKC[0][block_J]
    else:
      row_JC = jnp.take_along_axis(count_JKC, block_J[:, None, None], axis=1)[:, 0]
    col_J, within_J = _locate(row_JC, rank_J - before_J)
    return jnp.minimum(block_J * _BLOCK + col_J, length - 1), before_J + within_J
  tri_LL = _TRI[:length, :length]
  cum_JL = jnp.dot(count_JL, tri_LL, preferred_element_type=jnp.int32)   # inclusive
  before_JL = (cum_JL <= rank_J[:, None]).astype(jnp.int32)   # buckets wholly below rank
  pos_J, below_J = _sum_last(jnp.stack([before_JL, before_JL * count_JL], axis=1)).T
  return jnp.minimum(pos_J, length - 1), below_J


def _radix_select(key_M: Array, valid_M: Array | None,
                  ranks_of_n: Callable[[Array], Array]
                  ) -> tuple[Array, Array, Array, Array]:
  """The `ranks_of_n(n)`-th smallest (0-based) valid keys, the counts of valid keys below
  and equal to each, and n, the number of valid keys (from the first histogram).

  Ranks must lie in [0, n) (the callers clip); with n = 0 the keys are meaningless and
  the counts 0.
  """
  hi_M = (key_M >> _DIGIT_BITS).astype(jnp.int32)
  lo_M = (key_M & jnp.uint32(_LOW)).astype(jnp.int32)
  idx1_M = hi_M if valid_M is None else jnp.where(valid_M, hi_M, _BUCKETS)
  hist1_H = jnp.zeros(_BUCKETS, jnp.int32).at[idx1_M].add(1, mode="drop")
  n = key_M.shape[0] if valid_M is None else _sum_last(hist1_H)
  rank_J = ranks_of_n(jnp.asarray(n, jnp.int32))
  num_ranks = rank_J.shape[0]
  hi_J, below_J = _locate(hist1_H[None], rank_J)
  # Pass 2: one histogram row per distinct top bucket; an entry goes to the first rank
  # whose bucket it matches, and a rank reads the row of the first rank with its bucket.
  drop = num_ranks * _BUCKETS                           # out of range: dropped by scatter
  idx2_M = jnp.full(key_M.shape, drop, jnp.int32)
  for j in reversed(range(num_ranks)):
    match_M = hi_M == hi_J[j]
    if valid_M is not None:
      match_M &= valid_M
    idx2_M = jnp.where(match_M, j * _BUCKETS + lo_M, idx2_M)
  hist2_JH = (jnp.zeros(num_ranks * _BUCKETS, jnp.int32).at[idx2_M].add(1, mode="drop")
              .reshape(num_ranks, _BUCKETS))
  first_J = jnp.argmax(hi_J[:, None] == hi_J[None, :], axis=-1)
  row_JH = hist2_JH[first_J]
  lo_J, below2_J = _locate(row_JH, rank_J - below_J)
  equal_J = jnp.take_along_axis(row_JH, lo_J[:, None], axis=1)[:, 0]
  key_J = (hi_J.astype(jnp.uint32) << _DIGIT_BITS) | lo_J.astype(jnp.uint32)
  return key_J, below_J + below2_J, equal_J, jnp.asarray(n, jnp.int32)


def _flat(x: ArrayLike, mask: ArrayLike | None) -> tuple[Array, Array | None]:
  x = jnp.asarray(x, jnp.float32).reshape(-1)
  if mask is None:
    return x, None
  mask = jnp.asarray(mask).astype(bool).reshape(-1)
  if mask.shape != x.shape:
    raise ValueError(f"mask has {mask.shape[0]} entries, x has {x.shape[0]}")
  return x, mask


def masked_order_statistics(x: ArrayLike, mask: ArrayLike | None, ranks: ArrayLike) -> Array:
  """The `ranks`-th smallest (0-based) valid entries of x, in `jnp.sort` order.

  Equals `jnp.sort(x[mask])[ranks]` for ranks in [0, n), n the valid count (traced);
  ranks outside are clipped to [0, n−1]. No valid entry gives 0. Masked entries (even
  NaN ones) never reach the output; valid NaN / ±inf are ordered as `jnp.sort` orders them.

  Args:
    x: float array of any shape (cast to float32).
    mask: bool array of x's size, or None (all valid).
    ranks: int scalar or [J] vector (traced; J static).

  Returns:
    float32 of `ranks`' shape.

  >>> import numpy as np
  >>> x = np.array([[3., -1., 7.], [2., 9., 0.]], np.float32)
  >>> m = np.array([[1, 1, 1], [1, 0, 1]], bool)
  >>> masked_order_statistics(x, m, np.array([0, 2, 4])).tolist()
  [-1.0, 2.0, 7.0]
  """
  return _order_statistics(x, mask, ranks)


# The public functions run as one compiled program each (as jax.numpy's do): called eagerly,
# a few hundred primitives would otherwise be dispatched (and compiled) one by one.
@jax.jit
def _order_statistics(x, mask, ranks):
  x_M, valid_M = _flat(x, mask)
  ranks = jnp.asarray(ranks, jnp.int32)
  key_J, _, _, n = _radix_select(_sort_key(x_M), valid_M,
                              lambda n: jnp.clip(ranks.reshape(-1), 0, jnp.maximum(n - 1, 0)))
  return jnp.where(n > 0, _key_to_float(key_J), 0.0).reshape(ranks.shape)


def masked_quantiles(x: ArrayLike, mask: ArrayLike | None,
                     quantiles: tuple[float, ...]) -> Array:
  """Linear-interpolation quantiles (numpy `method="linear"`) of the valid entries of x.

  .. math::
    p = q·(n − 1),  lo = ⌊p⌋,  hi = min(lo + 1, n − 1),  Q_q = x_(lo) + (p − lo)·(x_(hi) − x_(lo))

  with x_(i) the i-th smallest valid entry (`masked_order_statistics`) and p computed in
  float32 (bit-identical to indexing a sorted copy). No valid entry gives 0.

  Args:
    x: float array of any shape.
    mask: bool array of x's size, or None.
    quantiles: static tuple of q ∈ [0, 1].

  Returns:
    [len(quantiles)] float32.

  >>> import numpy as np
  >>> x = np.array([0.2, 1.5, 0.4, 0.9, 7.0], np.float32)
  >>> np.round(np.asarray(masked_quantiles(x, x < 5, (0.1, 0.9)), np.float64), 4).tolist()
  [0.26, 1.32]
  """
  return _quantiles(x, mask, jnp.stack([jnp.asarray(q, jnp.float32) for q in quantiles]))


@jax.jit
def _quantiles(x, mask, q_Q):
  x_M, valid_M = _flat(x, mask)
  frac = []
  quantiles = list(q_Q)

  def ranks_of_n(n):
    last = jnp.maximum(n - 1, 0)
    lo = []
    for q in quantiles:
      pos = q * last.astype(jnp.float32)
      lo_q = jnp.floor(pos)
      frac.append(pos - lo_q)
      lo.append(jnp.clip(lo_q.astype(jnp.int32), 0, last))
    lo_Q = jnp.stack(lo)
    return jnp.concatenate([lo_Q, jnp.minimum(lo_Q + 1, last)])

  key_J, _, _, n = _radix_select(_sort_key(x_M), valid_M, ranks_of_n)
  v_J = jnp.where(n > 0, _key_to_float(key_J), 0.0)
  v_lo, v_hi = v_J[:len(quantiles)], v_J[len(quantiles):]
  return v_lo + jnp.stack(frac) * (v_hi - v_lo)


def _rows_of(size: int) -> tuple[int, int]:
  """A static [R, C] layout of `size` entries (padded when needed), C a power of two ≥ √size."""
  cols = 1 << max(math.isqrt(max(size - 1, 0)).bit_length(), 0)
  return max(-(-size // cols), 1), cols


def smallest_k_mask(x: ArrayLike, k: ArrayLike, mask: ArrayLike | None = None) -> Array:
  """The k smallest valid entries of x as a bool mask; ties go to the lower flat index.

  Equals `stable_rank < k` over the valid entries, with `stable_rank` the position in a
  stable `jnp.argsort` of the row-major flattened valid entries: every entry strictly below
  the k-th smallest value, then the first (k − #below) entries equal to it by flat index
  (when that is not all of them: located by counts over [R, C] rows of the flat array,
  then within one row). k ≤ 0
  selects nothing, k ≥ n every valid entry.

  Args:
    x: float array of any shape (cast to float32).
    k: int scalar (traced).
    mask: bool array of x's shape, or None.

  Returns:
    bool of x's shape, False outside `mask`.

  >>> import numpy as np
  >>> smallest_k_mask(np.array([[2., 1., 2.], [2., 0., 5.]], np.float32), 3).tolist()
  [[True, True, False], [False, True, False]]
  """
  return _smallest_k(x, k, mask)


@jax.jit
def _smallest_k(x, k, mask):
  shape = jnp.shape(x)
  x_M, valid_M = _flat(x, mask)
  key_M = _sort_key(x_M)
  k = jnp.asarray(k, jnp.int32)
  key_J, below_J, equal_J, n = _radix_select(
      key_M, valid_M, lambda n: jnp.clip(k - 1, 0, jnp.maximum(n - 1, 0))[None])
  kth, below, equal = key_J[0], below_J[0], equal_J[0]
  need = jnp.minimum(k, n) - below      # ties of the k-th value to take, in flat order
  index_M = jnp.arange(x_M.shape[0], dtype=jnp.int32)

  def last_tie_index(_):
    """Flat index of the need-th valid entry equal to the k-th value."""
    tie_M = key_M == kth
    if valid_M is not None:
      tie_M &= valid_M
    size = x_M.shape[0]
    rows, cols = _rows_of(size)
    tie_RC = jnp.pad(tie_M, (0, rows * cols - size)).reshape(rows, cols).astype(jnp.int32)
    r, before = _locate(_sum_last(tie_RC)[None], need[None] - 1)
    c, _ = _locate(jax.lax.dynamic_index_in_dim(tie_RC, r[0], keepdims=True),
                   need[None] - 1 - before)
    return r[0] * cols + c[0]

  # Usually every tie is taken (need = #equal, e.g. no ties at all): skip the tie count.
  last = jax.lax.cond(need < equal, last_tie_index,
                      lambda _: jnp.asarray(x_M.shape[0], jnp.int32), None)
  sel_M = (key_M < kth) | ((key_M == kth) & (index_M <= last))
  if valid_M is not None:
    sel_M &= valid_M
  return (sel_M & (k > 0) & (n > 0)).reshape(shape)


# Row-wise selection ([B,R]: one order statistic per row). A histogram per row would cost
# 65,536 buckets for every row; instead a binary search on the 32-bit key, one compare-and-
# count pass over the row per bit, run over blocks of rows that stay in cache.
_ROW_BLOCK = 32


def _row_kth_key(key_BR: Array, valid_BR: Array, rank_B: Array, bits: int = 32) -> Array:
  """[B] uint32: the `rank_B`-th smallest (0-based) valid key of each row: the largest v
  with #{valid keys < v} ≤ rank, built from the top bit down (keys below 2^bits)."""
  def search(key_CR, valid_CR, rank_C):
    def step(i, ans):
      cand = ans | jnp.left_shift(jnp.uint32(1), (bits - 1 - i).astype(jnp.uint32))
      below = jnp.sum(valid_CR & (key_CR < cand[:, None]), axis=1, dtype=jnp.int32)
      return jnp.where(below <= rank_C, cand, ans)
    return jax.lax.fori_loop(0, bits, step, jnp.zeros(key_CR.shape[0], jnp.uint32))

  b, r = key_BR.shape
  if b <= _ROW_BLOCK:
    return search(key_BR, valid_BR, rank_B)
  pad = (-b) % _ROW_BLOCK
  blocks = lambda a: jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1)).reshape(
      -1, _ROW_BLOCK, *a.shape[1:])
  out = jax.lax.map(lambda a: search(*a), (blocks(key_BR), blocks(valid_BR), blocks(rank_B)))
  return out.reshape(-1)[:b]


def row_smallest_k(x: ArrayLike, k: ArrayLike, mask: ArrayLike | None = None
                   ) -> tuple[Array, Array, Array]:
  """Per row of a [B,R] array, the k_b-th smallest valid entry and the counts around it.

  With n_b the valid count and j_b = clip(k_b − 1, 0, n_b − 1): (v [B] float32, the j_b-th
  smallest valid entry in `jnp.sort` order, 0 for a row without valid entries; below [B]
  int32, the valid entries strictly below v; equal [B] int32, those equal to v). Sort-free:
  32 compare-and-count passes over the rows.

  >>> import numpy as np
  >>> v, below, equal = row_smallest_k(np.array([[3., 1., 1., 2.]], np.float32), np.array([3]))
  >>> v.tolist(), below.tolist(), equal.tolist()
  ([2.0], [2], [1])
  """
  x_BR = jnp.asarray(x, jnp.float32)
  if x_BR.ndim != 2:
    raise ValueError(f"row_smallest_k: x must be [B,R], got shape {x_BR.shape}; reshape it")
  valid_BR = (jnp.ones(x_BR.shape, bool) if mask is None
              else jnp.broadcast_to(jnp.asarray(mask).astype(bool), x_BR.shape))
  key_BR = _sort_key(x_BR)
  n_B = jnp.sum(valid_BR, axis=1, dtype=jnp.int32)
  k_B = jnp.broadcast_to(jnp.asarray(k, jnp.int32), n_B.shape)
  kth_B = _row_kth_key(key_BR, valid_BR, jnp.clip(k_B - 1, 0, jnp.maximum(n_B - 1, 0)))
  below_B = jnp.sum(valid_BR & (key_BR < kth_B[:, None]), axis=1, dtype=jnp.int32)
  equal_B = jnp.sum(valid_BR & (key_BR == kth_B[:, None]), axis=1, dtype=jnp.int32)
  return jnp.where(n_B > 0, _key_to_float(kth_B), 0.0), below_B, equal_B


def row_smallest_k_mask(x: ArrayLike, k: ArrayLike, mask: ArrayLike | None = None) -> Array:
  """`smallest_k_mask` of every row of a [B,R] array, with its own k_b ([B] or a scalar).

  Equals `jax.vmap(smallest_k_mask)(x, k, mask)` (the k_b smallest valid entries of row b,
  ties to the lower column), without a histogram per row: `row_smallest_k`, then the ties
  of the k-th value counted along the row only when some row takes part of them.

  >>> import numpy as np
  >>> row_smallest_k_mask(np.array([[2., 1., 2.], [2., 0., 5.]], np.float32),
  ...                     np.array([2, 1])).tolist()
  [[True, True, False], [False, True, False]]
  """
  x_BR = jnp.asarray(x, jnp.float32)
  valid_BR = (jnp.ones(x_BR.shape, bool) if mask is None
              else jnp.broadcast_to(jnp.asarray(mask).astype(bool), x_BR.shape))
  v_B, below_B, equal_B = row_smallest_k(x_BR, k, valid_BR)
  key_BR, kth_B = _sort_key(x_BR), _sort_key(v_B)
  n_B = jnp.sum(valid_BR, axis=1, dtype=jnp.int32)
  k_B = jnp.broadcast_to(jnp.asarray(k, jnp.int32), n_B.shape)
  need_B = jnp.minimum(k_B, n_B) - below_B          # ties of the k-th value to take
  tie_BR = valid_BR & (key_BR == kth_B[:, None])

  def some_ties(_):   # the first need_b ties of each row: up to the need_b-th tie's column
    col_BR = jnp.broadcast_to(jnp.arange(x_BR.shape[1], dtype=jnp.uint32), x_BR.shape)
    last_B = _row_kth_key(col_BR, tie_BR, jnp.maximum(need_B - 1, 0),
                          bits=max(int(x_BR.shape[1] - 1).bit_length(), 1))
    return tie_BR & (col_BR <= last_B[:, None]) & (need_B > 0)[:, None]

  ties_BR = jax.lax.cond(jnp.any(need_B < equal_B), some_ties, lambda _: tie_BR, None)
  sel_BR = valid_BR & (key_BR < kth_B[:, None]) | ties_BR
  return sel_BR & ((k_B > 0) & (n_B > 0))[:, None]
