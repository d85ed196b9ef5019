"""Tests for the sort-free order statistics (credit/ops/select.py) against sort-based numpy.

The references sort the valid entries with numpy's stable sort (NaN last, −0 = +0, as
`jnp.sort`). Values come from a pool with ties, ±0.0, negatives, ±inf, ±3e38 and NaN, on
masks with all-masked rows, a single valid entry and no valid entry at all. Subnormals
are left out: XLA CPU flushes them to zero when comparing, numpy does not.
"""
from __future__ import annotations

import doctest
import functools

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import ops
from credit.ops import select

POOL = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, np.inf, -np.inf, 3e38, -3e38, 1e-30, np.nan],
                np.float32)


@st.composite
def arrays(draw, nan=True):
  """(x, mask): [R,C] float32 from POOL or a normal draw, and a mask with masked rows."""
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  shape = draw(st.sampled_from([(1, 1), (1, 7), (3, 4), (6, 9)]))   # few compiles
  pool = POOL if nan else POOL[~np.isnan(POOL)]
  x = np.where(rng.random(shape) < draw(st.sampled_from([0.0, 0.5, 1.0])),
               rng.choice(pool, shape), rng.normal(size=shape) * 10).astype(np.float32)
  kind = draw(st.sampled_from(["random", "rows", "one", "none", "all"]))
  if kind == "random":
    mask = rng.random(shape) < rng.random()
  elif kind == "rows":          # whole rows masked
    mask = np.repeat(rng.random((shape[0], 1)) < 0.5, shape[1], axis=1)
  elif kind == "one":           # a single valid entry
    mask = np.zeros(shape, bool)
    mask[rng.integers(shape[0]), rng.integers(shape[1])] = True
  else:
    mask = np.full(shape, kind == "all")
  # Masked entries hold NaN sometimes: it must never reach an output.
  x = np.where(~mask & (rng.random(shape) < 0.3), np.float32(np.nan), x)
  return x, mask


def ref_sorted(x, mask):
  return np.sort(x[mask], kind="stable")


def ref_quantiles(x, mask, quantiles):
  """The former EAPO `_masked_quantiles` (a full `jnp.sort`), kept as the reference: the
  same float32 expression, so XLA rounds it the same way (it may use an FMA)."""
  flat = jnp.where(mask, x, jnp.inf).reshape(-1)
  sorted_ = jnp.sort(flat)
  n = jnp.sum(mask.astype(jnp.int32))
  sorted_ = jnp.where(jnp.arange(sorted_.shape[0]) < n, sorted_, 0.0)
  last = jnp.maximum(n - 1, 0)
  out = []
  for q in quantiles:
    pos = jnp.asarray(q, jnp.float32) * last.astype(jnp.float32)
    lo = jnp.floor(pos)
    frac = pos - lo
    lo = jnp.clip(lo.astype(jnp.int32), 0, last)
    hi = jnp.minimum(lo + 1, last)
    out.append(sorted_[lo] + frac * (sorted_[hi] - sorted_[lo]))
  return jnp.stack(out)


def ref_smallest_k(x, mask, k):
  """Stable-argsort rank < k over the row-major flattened valid entries."""
  order = np.argsort(x[mask], kind="stable")
  rank = np.empty_like(order)
  rank[order] = np.arange(order.size)
  out = np.zeros(x.shape, bool)
  out[mask] = rank < k
  return out


@functools.lru_cache(maxsize=None)
def jitted_quantiles(quantiles):
  return jax.jit(functools.partial(ops.masked_quantiles, quantiles=quantiles))


@functools.lru_cache(maxsize=None)
def jitted_ref_quantiles(quantiles):
  return jax.jit(functools.partial(ref_quantiles, quantiles=quantiles))


def test_doctests():
  res = doctest.testmod(select, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_public_names_are_re_exported():
  for name in select.__all__:
    assert getattr(ops, name) is getattr(select, name), name
    assert name in ops.__all__


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(xm=arrays())
def test_order_statistics_equal_a_sort(xm):
  x, mask = xm
  n = int(mask.sum())
  # A fixed number of ranks (one compile per shape), outside [0, n) too: those are clipped.
  ranks = np.array([-1, 0, n // 3, n // 2, n - 1, n, n + 1], np.int32)
  got = np.asarray(jax.jit(ops.masked_order_statistics)(x, mask, ranks))
  want = ref_sorted(x, mask)[np.clip(ranks, 0, max(n - 1, 0))] if n else np.zeros(ranks.shape)
  np.testing.assert_array_equal(got, want)
  assert not np.isnan(got).any() or np.isnan(x[mask]).any()


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(xm=arrays(), quantiles=st.sampled_from([(0.0, 0.37, 1.0), (0.1, 0.9)]))
def test_quantiles_equal_the_sort_based_reference(xm, quantiles):
  x, mask = xm
  got = np.asarray(jitted_quantiles(quantiles)(x, mask))
  np.testing.assert_array_equal(got, np.asarray(jitted_ref_quantiles(quantiles)(x, mask)))
  # Its inputs are the numpy-sorted values at ⌊q(n−1)⌋ and the next rank.
  s, n = ref_sorted(x, mask), int(mask.sum())
  for q, g in zip(quantiles, got):
    lo = int(np.floor(np.float32(q) * np.float32(max(n - 1, 0))))
    if n and np.isfinite(s[lo]) and np.isfinite(s[min(lo + 1, n - 1)]):
      assert min(s[lo], s[min(lo + 1, n - 1)]) <= g <= max(s[lo], s[min(lo + 1, n - 1)])


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(xm=arrays(nan=False))
def test_quantiles_match_numpy_linear(xm):
  x, mask = xm
  x = np.clip(np.nan_to_num(x), -1e30, 1e30).astype(np.float32)   # finite, no overflow
  hypothesis.assume(mask.any())
  got = np.asarray(jitted_quantiles((0.1, 0.9))(x, mask), np.float64)
  want = np.quantile(x[mask].astype(np.float64), (0.1, 0.9), method="linear")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(xm=arrays(), data=st.data())
def test_smallest_k_equals_a_stable_argsort(xm, data):
  x, mask = xm
  k = data.draw(st.integers(-1, int(mask.sum()) + 1))
  got = np.asarray(jax.jit(ops.smallest_k_mask)(x, k, mask))
  np.testing.assert_array_equal(got, ref_smallest_k(x, mask, k))
  # Without a mask every entry is valid.
  got = np.asarray(jax.jit(ops.smallest_k_mask)(x, k))
  np.testing.assert_array_equal(got, ref_smallest_k(x, np.ones(x.shape, bool), k))


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(xm=arrays(), data=st.data())
def test_row_smallest_k_equals_smallest_k_per_row(xm, data):
  x, mask = xm
  k = np.asarray(data.draw(st.lists(st.integers(-1, x.shape[1] + 1), min_size=x.shape[0],
                                    max_size=x.shape[0])), np.int32)
  got = np.asarray(jax.jit(ops.row_smallest_k_mask)(x, k, mask))
  for b in range(x.shape[0]):
    np.testing.assert_array_equal(got[b], ref_smallest_k(x[b:b + 1], mask[b:b + 1], k[b])[0])
  v, below, equal = map(np.asarray, jax.jit(ops.row_smallest_k)(x, k, mask))
  for b in range(x.shape[0]):
    s = ref_sorted(x[b:b + 1], mask[b:b + 1])
    if not len(s):
      assert v[b] == 0 and below[b] == 0 and equal[b] == 0
      continue
    np.testing.assert_array_equal(v[b], s[np.clip(k[b] - 1, 0, len(s) - 1)])


def test_row_smallest_k_blocks_rows():
  """More rows than one block (and not a multiple of it): the padded blocks are dropped."""
  rng = np.random.default_rng(3)
  x = rng.integers(0, 5, (70, 9)).astype(np.float32)
  mask, k = rng.random((70, 9)) < 0.7, rng.integers(0, 10, 70).astype(np.int32)
  got = np.asarray(jax.jit(ops.row_smallest_k_mask)(x, k, mask))
  want = np.asarray(jax.jit(jax.vmap(ops.smallest_k_mask))(x, k, mask))
  np.testing.assert_array_equal(got, want)


def test_ties_are_broken_by_flat_index():
  x = np.array([[1.0, 0.0, 1.0, -0.0], [1.0, 5.0, 0.0, 1.0]], np.float32)
  for k, want in [(1, [[0, 1, 0, 0], [0, 0, 0, 0]]), (2, [[0, 1, 0, 1], [0, 0, 0, 0]]),
                  (4, [[1, 1, 0, 1], [0, 0, 1, 0]]), (5, [[1, 1, 1, 1], [0, 0, 1, 0]]),
                  (6, [[1, 1, 1, 1], [1, 0, 1, 0]]), (0, [[0] * 4, [0] * 4])]:
    np.testing.assert_array_equal(ops.smallest_k_mask(x, k), np.array(want, bool), str(k))
  # −0 and +0 are one value: the 2nd smallest of [+0, −0] is a zero.
  assert float(ops.masked_order_statistics(np.array([0.0, -0.0], np.float32), None, 1)) == 0.0


def test_no_valid_entry():
  x = np.full((3, 4), np.nan, np.float32)
  mask = np.zeros((3, 4), bool)
  np.testing.assert_array_equal(ops.masked_order_statistics(x, mask, np.arange(3)), 0.0)
  np.testing.assert_array_equal(ops.masked_quantiles(x, mask, (0.1, 0.9)), 0.0)
  assert not np.asarray(ops.smallest_k_mask(x, 2, mask)).any()


def test_many_entries_and_large_values():
  # Enough entries to fill several top-16-bit buckets and several [R, C] rows.
  rng = np.random.default_rng(1)
  x = rng.choice(np.array([-3e38, -1.0, 0.0, 2.0, 7.5, 3e38], np.float32), (37, 1001))
  x = np.where(rng.random(x.shape) < 0.5, rng.normal(size=x.shape) * 1e4, x).astype(np.float32)
  mask = rng.random(x.shape) < 0.8
  n = int(mask.sum())
  ranks = np.array([0, 1, n // 10, n // 2, n - 2, n - 1], np.int32)
  # Jitted (eager dispatch of the radix passes costs more than compiling them once).
  np.testing.assert_array_equal(jax.jit(ops.masked_order_statistics)(x, mask, ranks),
                                ref_sorted(x, mask)[ranks])
  smallest = jax.jit(ops.smallest_k_mask)
  for k in (1, n // 5, n // 5 + 1, n - 1, n):
    np.testing.assert_array_equal(smallest(x, k, mask), ref_smallest_k(x, mask, k))
  q = (0.1, 0.9)
  np.testing.assert_array_equal(jitted_quantiles(q)(x, mask), jitted_ref_quantiles(q)(x, mask))


def test_vmap_over_k_and_no_retrace():
  rng = np.random.default_rng(2)
  x = rng.choice(np.array([0.0, 1.0, 2.0], np.float32), (4, 8))
  mask = rng.random(x.shape) < 0.7
  ks = np.array([0, 1, 5, 9, int(mask.sum())], np.int32)
  # jit: eager is slow. x and mask go in as arguments: closed over, they are compile-time
  # constants and XLA folds the radix select's histograms of them (~0.7 s more compile).
  got = jax.jit(jax.vmap(lambda k, x, m: ops.smallest_k_mask(x, k, m),
                         in_axes=(0, None, None)))(ks, x, mask)
  for k, g in zip(ks, np.asarray(got)):
    np.testing.assert_array_equal(g, ref_smallest_k(x, mask, k))

  @jax.jit
  def f(x, m):
    return ops.masked_quantiles(x, m, (0.1, 0.9))
  f(x, mask)
  f(x + 1, ~mask)
  assert f._cache_size() == 1


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="mask"):
    ops.masked_quantiles(np.zeros(4, np.float32), np.ones(5, bool), (0.5,))
