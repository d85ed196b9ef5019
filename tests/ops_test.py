"""Tests of credit.ops: masked reductions, group statistics and the group-estimator preamble,
recurrences, turns."""
import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, strategies as st

from credit import ops

N, G, T = 3, 4, 6
B = N * G

floats = st.floats(-100, 100, allow_nan=False, width=32)


def np_group_norm(values, gid, num_groups, valid, scale, eps, singleton):
  out = np.zeros(len(values), np.float64)
  for g in range(num_groups):
    idx = [i for i in range(len(values)) if gid[i] == g and valid[i]]
    if not idx:
      continue
    x = np.asarray(values, np.float64)[idx]
    if len(idx) == 1:
      out[idx] = x if singleton == "raw" else 0.0
      continue
    mu, sd = x.mean(), x.std(ddof=1)
    out[idx] = (x - mu) / (sd + eps) if scale else x - mu
  return out


class MaskedTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_mean_var_empty_mask_is_zero(self):
    x = jnp.array([[1.0, jnp.nan, 3.0]])
    m = jnp.array([[False, False, False]])
    mean = self.variant(ops.masked_mean)(x, m)
    var = self.variant(ops.masked_var)(x, m)
    np.testing.assert_array_equal(np.asarray(mean), 0.0)
    np.testing.assert_array_equal(np.asarray(var), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_whiten_spec_example(self):
    # outcome_and_clipping.md §4: valid returns {1,1,0,0,0} -> 1.095445 / -0.730297.
    x = jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    m = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
    y = self.variant(ops.masked_whiten)(x, m)
    np.testing.assert_allclose(y, [[1.095445, 1.095445, 0.0], [-0.730297] * 3], atol=1e-5)

  def test_masked_whiten_single_token_is_zero_not_nan(self):
    y = ops.masked_whiten(jnp.array([[5.0, 7.0]]), jnp.array([[True, False]]))
    np.testing.assert_array_equal(y, [[0.0, 0.0]])

  @given(hnp.arrays(np.float32, (4, 5), elements=floats),
         hnp.arrays(np.bool_, (4, 5)))
  def test_masked_var_matches_numpy(self, x, m):
    got = float(ops.masked_var(x, m))
    sel = x[m].astype(np.float64)
    want = sel.var(ddof=1) if sel.size > 1 else 0.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


  @given(hnp.arrays(np.float32, (4,), elements=floats),
         hnp.arrays(np.int64, (4,), elements=st.integers(0, 5)))
  def test_weighted_whiten_equals_masked_whiten_of_the_broadcast(self, x, lengths):
    m = np.arange(5)[None, :] < lengths[:, None]
    want = ops.masked_whiten(ops.broadcast_to_tokens(x, m), m)
    got = ops.broadcast_to_tokens(ops.weighted_whiten(x, ops.sequence_lengths(m)), m)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

  def test_safe_div_is_zero_where_the_denominator_is(self):
    num, den = jnp.array([1.0, 2.0, 3.0]), jnp.array([2.0, 0.0, -1.0])
    np.testing.assert_array_equal(ops.safe_div(num, den), [0.5, 0.0, -3.0])
    g = jax.grad(lambda d: jnp.sum(ops.safe_div(num, d)))(den)
    assert np.all(np.isfinite(g)) and float(g[1]) == 0.0


class GroupTest(parameterized.TestCase):

  @given(hnp.arrays(np.float32, (B,), elements=floats), hnp.arrays(np.bool_, (B,)),
         st.booleans(), st.sampled_from(["zero", "raw"]))
  def test_segment_path_equals_dense_path_and_numpy(self, v, valid, scale, singleton):
    gid = np.repeat(np.arange(N), G).astype(np.int32)
    seg = ops.group_normalize(v, gid, N, valid=valid, scale=scale, singleton=singleton)
    dense = ops.group_normalize(v, None, None, valid=valid, scale=scale, singleton=singleton,
                                group_size=G)
    want = np_group_norm(v, gid, N, valid, scale, 1e-6, singleton)
    np.testing.assert_allclose(seg, dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(seg, want, rtol=1e-4, atol=2e-4)

  def test_group_moments_paths_agree(self):
    v = np.random.default_rng(0).normal(size=B).astype(np.float32)
    a = ops.group_moments(v, np.repeat(np.arange(N), G), N)
    b = ops.group_moments_dense(v.reshape(N, G))
    for x, y in zip(a, b):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)

  @parameterized.parameters(
      ([1.0, 1.0, 1.0, 1.0 + 1e-6],),
      ([1000.0, 1000.0, 1000.0, 1000.01],),
      ([1e6, 1e6 + 1, 1e6 + 2, 1e6 + 3],),
  )
  def test_no_float32_cancellation(self, rewards):
    r32 = np.asarray(rewards, np.float32)
    r64 = r32.astype(np.float64)  # the exact values the float32 input holds
    want = (r64 - r64.mean()) / (r64.std(ddof=1) + 1e-6)
    got = ops.group_normalize(r32, np.zeros(4, np.int32), 1)
    np.testing.assert_allclose(got, want, rtol=1e-4)

  def test_all_equal_group_is_exact_zero(self):
    got = ops.group_normalize(jnp.full((4,), 0.3), jnp.zeros(4, jnp.int32), 1)
    np.testing.assert_array_equal(got, 0.0)

  def test_permutation_within_group(self):
    v = np.random.default_rng(1).normal(size=B).astype(np.float32)
    gid = np.repeat(np.arange(N), G)
    perm = np.concatenate([np.random.default_rng(2).permutation(G) + g * G for g in range(N)])
    a = ops.group_normalize(v, gid, N)
    b = ops.group_normalize(v[perm], gid[perm], N)
    np.testing.assert_allclose(np.asarray(a)[perm], b, atol=1e-6)

  def test_out_of_range_group_ids_are_ignored(self):
    v = jnp.array([1.0, 2.0, 3.0, 100.0])
    gid = jnp.array([0, 0, 0, 5])
    out = ops.group_normalize(v, gid, 1)
    np.testing.assert_allclose(out[:3], [-1, 0, 1], atol=1e-5)
    assert float(out[3]) == 0.0

  def test_gradients_finite_on_degenerate_groups(self):
    gid = jnp.array([0, 0, 1, 2])
    f = lambda v, gid: jnp.sum(ops.group_normalize(v, gid, 3) ** 2)
    g = jax.jit(jax.grad(f))(jnp.array([1.0, 1.0, 2.0, 3.0]), gid)
    assert np.all(np.isfinite(g))


  @chex.variants(with_jit=True, without_jit=True)
  def test_group_rows_fast_and_segment_paths(self):
    reward = np.arange(B, dtype=np.float32)
    mask = np.ones((B, 3), bool)
    mask[2] = False                               # an empty response: not valid
    gid = np.repeat(np.arange(N), G).astype(np.int32)
    gid[5] = N                                    # out of range: not valid on the segment path

    def both(reward, gid, mask):
      seg = ops.group_rows("f", reward, gid, N, response_mask=mask)
      fast = ops.group_rows("f", reward, None, N, G, response_mask=mask)
      return seg, fast

    seg, fast = self.variant(both)(reward, gid, mask)
    np.testing.assert_array_equal(seg.values, reward)
    np.testing.assert_array_equal(seg.group_id, gid)
    np.testing.assert_array_equal(fast.group_id, np.repeat(np.arange(N), G))
    np.testing.assert_array_equal(seg.mask, mask)
    want = np.ones(B, bool)
    want[2] = False
    np.testing.assert_array_equal(fast.valid, want)
    want[5] = False
    np.testing.assert_array_equal(seg.valid, want)

  def test_group_rows_from_a_row_validity(self):
    rows = ops.group_rows("f", np.ones(4), np.array([0, 0, 1, 1]), 2,
                          valid=np.array([True, False, True, True]))
    assert rows.mask is None
    np.testing.assert_array_equal(rows.valid, [True, False, True, True])
    rows = ops.group_rows("f", np.ones(4), None, 2, 2, response_mask=np.ones((4, 2), bool),
                          valid=np.array([True, True, False, True]))
    np.testing.assert_array_equal(rows.valid, [True, True, False, True])

  @parameterized.parameters(
      (dict(num_groups=0), "f: num_groups must be a Python int >= 1"),
      (dict(num_groups=2.0), "num_groups must be a Python int"),
      (dict(group_size=3), "batch size 4 is not a multiple of group_size=3"),
      (dict(group_size=0), "group_size must be a Python int"),
      (dict(group_id=None), "group_id is required on the segment path"),
  )
  def test_group_rows_bad_layout_raises(self, kwargs, match):
    args = dict(group_id=np.zeros(4, np.int32), num_groups=1, group_size=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
      ops.group_rows("f", np.ones(4), args["group_id"], args["num_groups"], args["group_size"],
                     response_mask=np.ones((4, 2), bool))

  def test_group_rows_shape_mismatch_raises(self):
    with pytest.raises(AssertionError):
      ops.group_rows("f", np.ones(4), np.zeros(3, np.int32), 1)
    with pytest.raises(AssertionError):
      ops.group_rows("f", np.ones(4), np.zeros(4, np.int32), 1, response_mask=np.ones((3, 2)))
    with pytest.raises(AssertionError):
      ops.group_rows("f", np.ones(4), np.zeros(4, np.float32), 1)

  @given(hnp.arrays(np.float32, (B,), elements=floats), hnp.arrays(np.bool_, (B,)))
  def test_row_reductions_fast_equal_segment_and_numpy(self, v, valid):
    gid = np.repeat(np.arange(N), G).astype(np.int32)
    reduced, count, count_fast, mom_seg, mom_fast, mom = _row_reductions(v, gid, valid)
    for op, npop in (("sum", np.sum), ("max", np.max), ("min", np.min)):
      seg, fast = reduced[op]
      for i in np.flatnonzero(valid):
        members = v[(gid == gid[i]) & valid].astype(np.float64)
        np.testing.assert_allclose([seg[i], fast[i]], [npop(members)] * 2, rtol=1e-5,
                                   atol=1e-3)
    count = np.asarray(count)
    np.testing.assert_array_equal(count[valid], [np.sum(valid & (gid == g)) for g in gid[valid]])
    np.testing.assert_array_equal(np.asarray(count_fast)[valid], count[valid])
    for a, b_, per_group in zip(mom_seg, mom_fast, mom):
      np.testing.assert_allclose(a, np.asarray(per_group)[gid], rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(b_, a, rtol=1e-5, atol=1e-5)

  def test_group_reduce_rows_bad_op(self):
    with pytest.raises(ValueError, match="op 'mean'"):
      ops.group_reduce_rows(jnp.ones(4), jnp.zeros(4, jnp.int32), jnp.ones(4, bool), 1, None,
                            "mean")

  def test_group_normalize_bad_singleton(self):
    with pytest.raises(ValueError, match="singleton 'drop'"):
      ops.group_normalize(jnp.ones(4), jnp.zeros(4, jnp.int32), 1, singleton="drop")


@jax.jit
def _row_reductions(v, gid, valid):
  """Every row reduction on the segment and the fast path, one program for all examples."""
  reduced = {op: (ops.group_reduce_rows(v, gid, valid, N, None, op),
                  ops.group_reduce_rows(v, gid, valid, N, G, op)) for op in ("sum", "max", "min")}
  return (reduced, ops.group_count_rows(gid, valid, N, None),
          ops.group_count_rows(gid, valid, N, G), ops.group_moments_rows(v, gid, valid, N, None),
          ops.group_moments_rows(v, gid, valid, N, G), ops.group_moments(v, gid, N, valid))


def _loop_returns(x, m, gamma):
  """The masked discounted recurrence of `ops.discounted_reverse_cumsum`, a float64 loop."""
  want = np.zeros(x.shape)
  for idx in np.ndindex(x.shape[:-1]):
    run = 0.0
    for t in reversed(range(x.shape[-1])):
      if m[idx + (t,)]:
        run = x[idx + (t,)] + gamma * run
        want[idx + (t,)] = run
  return want


class RecurrenceTest(parameterized.TestCase):

  @given(hnp.arrays(np.float32, (3, 7), elements=st.floats(-5, 5, width=32)),
         hnp.arrays(np.bool_, (3, 7)), st.floats(0.0, 1.0))
  def test_discounted_reverse_cumsum_matches_loop(self, x, m, gamma):
    got = ops.discounted_reverse_cumsum(x, m, gamma)
    want = _loop_returns(x, m, float(np.float32(gamma)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

  def test_observation_tokens_do_not_reset_or_leak(self):
    # policy, policy, obs, obs, policy; reward on the last policy token.
    x = jnp.array([[0.0, 0.0, 9.0, 9.0, 1.0]])
    m = jnp.array([[1, 1, 0, 0, 1]], bool)
    got = ops.discounted_reverse_cumsum(x, m, 0.5)
    np.testing.assert_allclose(got, [[0.25, 0.5, 0.0, 0.0, 1.0]])

  def test_undiscounted_fast_path_equals_scan(self):
    x = jnp.array([[1.0, 2.0, 9.0, 3.0, 0.5]])
    m = jnp.array([[1, 1, 0, 1, 0]], bool)
    fast = ops.discounted_reverse_cumsum(x, m, 1.0)
    scan = ops.discounted_reverse_cumsum(x, m, jnp.float32(1.0))
    np.testing.assert_allclose(fast, [[6.0, 5.0, 0.0, 3.0, 0.0]])
    np.testing.assert_allclose(fast, scan)

  def test_jit_and_vmap_over_gamma(self):
    x = jnp.ones((2, 4))
    m = jnp.ones((2, 4), bool)
    f = jax.jit(jax.vmap(ops.discounted_reverse_cumsum, in_axes=(None, None, 0)))
    out = f(x, m, jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(out[0, 0], [4, 3, 2, 1])
    np.testing.assert_allclose(out[1, 0], [1, 1, 1, 1])

  @parameterized.parameters((1024,), (1100,), (2 * 1024 + 7,))
  def test_blocked_scan_of_long_rows_matches_loop(self, t):
    """Rows of >= RECURRENCE_BLOCK² positions take the two-level blocked scan (incl. padding of
    a last partial block); it agrees with the float64 loop, also with a traced γ under vmap
    and in gradient (∂G_t/∂x_t' = γ^(#valid between) for t' ≥ t)."""
    assert t >= ops.RECURRENCE_BLOCK ** 2
    rng = np.random.default_rng(t)
    x = rng.standard_normal((3, t)).astype(np.float32)
    m = rng.random((3, t)) > 0.3
    for gamma in (0.0, 0.97, 0.999):
      got = ops.discounted_reverse_cumsum(x, m, gamma)
      np.testing.assert_allclose(got, _loop_returns(x, m, gamma), rtol=1e-4, atol=1e-4)
    vm = jax.jit(jax.vmap(ops.discounted_reverse_cumsum, in_axes=(None, None, 0)))(
        x, m, jnp.array([0.97, 0.999]))
    np.testing.assert_allclose(vm[0], ops.discounted_reverse_cumsum(x, m, 0.97), rtol=1e-5,
                               atol=1e-5)
    g = jax.jit(jax.grad(lambda x, m: ops.discounted_reverse_cumsum(x, m, 0.9)[0, 0]))(
        jnp.asarray(x), m)
    valid0 = np.flatnonzero(m[0])
    want_g = np.zeros(t)
    if m[0, 0]:
      want_g[valid0] = 0.9 ** np.arange(len(valid0))
    np.testing.assert_allclose(g[0], want_g, rtol=1e-4, atol=1e-6)
    assert not np.asarray(g[1:]).any()

  @parameterized.parameters((48,), (40,), (16,))
  def test_prefix_sum_block_length(self, t):
    # Any T and block: a last partial block (40) is padded with zeros.
    x = np.random.default_rng(t).uniform(-1, 1, (3, t)).astype(np.float32)
    got = jax.jit(ops.prefix_sum)(x)
    np.testing.assert_allclose(got, np.cumsum(x.astype(np.float64), 1), atol=1e-5)
    np.testing.assert_allclose(ops.prefix_sum(x, block=8), got, atol=1e-5)

  @parameterized.parameters((5,), (16,), (40,), (300,))
  def test_prefix_sum_equals_cumsum(self, t):
    # t = 300 takes two block levels and a padded tail.
    rng = np.random.default_rng(t)
    x = rng.uniform(-1, 1, (3, t)).astype(np.float32)
    flags = rng.random((2, 3, t)) < 0.4
    f = jax.jit(ops.prefix_sum, static_argnames=("reverse",))
    np.testing.assert_allclose(f(x), np.cumsum(x.astype(np.float64), -1), atol=2e-5)
    np.testing.assert_allclose(f(x, reverse=True),
                               np.cumsum(x[:, ::-1].astype(np.float64), -1)[:, ::-1], atol=2e-5)
    got = f(flags)
    assert got.dtype == jnp.int32 and got.shape == flags.shape
    np.testing.assert_array_equal(got, np.cumsum(flags, -1))
    np.testing.assert_array_equal(f(flags, reverse=True), np.cumsum(flags[..., ::-1], -1)[..., ::-1])
    with pytest.raises(TypeError, match="float or bool"):
      ops.prefix_sum(np.arange(3))

  @parameterized.parameters((0.95, 300), (0.5, 40), (1.0, 17), (0.0, 33))
  def test_discounted_suffix_sum_equals_the_loop(self, gamma, t):
    x = np.random.default_rng(t).uniform(-1, 1, (2, t)).astype(np.float32)
    want = np.zeros((2, t))
    run = np.zeros(2)
    for i in reversed(range(t)):
      run = x[:, i] + gamma * run
      want[:, i] = run
    got = jax.jit(ops.discounted_suffix_sum, static_argnums=1)(x, gamma)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  @parameterized.parameters((0.95, True, 2), (0.5, True, 3), (1.0, True, 2), (0.95, False, 2),
                            (1.0, False, 3), (0.0, True, 2))
  def test_long_rows_take_block_products_or_the_scan(self, gamma, one_run, rank):
    # Rows of >= FAST_RECURRENCE_MIN_T positions: one run of valid tokens per row takes the
    # block products, holes take the scan (γ < 1); γ = 1 is a suffix sum for any mask. Both
    # agree with the loop, under jit and with a traced γ (always the scan).
    rng = np.random.default_rng(int(gamma * 100) + rank)
    t = ops.FAST_RECURRENCE_MIN_T + 35
    shape = (4, t) if rank == 2 else (2, 2, t)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    start, stop = rng.integers(0, 20, shape[:-1]), rng.integers(20, t + 1, shape[:-1])
    m = (np.arange(t) >= start[..., None]) & (np.arange(t) < stop[..., None])
    m.reshape(-1, t)[3] = False
    if not one_run:
      m &= rng.random(shape) > 0.3
    want = _loop_returns(x, m, gamma)
    got = jax.jit(ops.discounted_reverse_cumsum, static_argnums=2)(x, m, gamma)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.asarray(got)[~m].any()
    traced = jax.jit(ops.discounted_reverse_cumsum)(x, m, jnp.float32(gamma))
    np.testing.assert_allclose(traced, want, rtol=1e-5, atol=1e-5)

  def test_next_valid_value(self):
    got = ops.next_valid_value(jnp.arange(5.0)[None], jnp.array([[1, 0, 1, 1, 0]], bool))
    np.testing.assert_array_equal(got, [[2, 2, 3, 0, 0]])


class TokenAndTurnTest(parameterized.TestCase):

  def test_broadcast_and_last_token(self):
    m = jnp.array([[1, 1, 0], [0, 0, 0], [1, 0, 1]], bool)
    np.testing.assert_array_equal(ops.broadcast_to_tokens(jnp.array([2.0, 3.0, 4.0]), m),
                                  [[2, 2, 0], [0, 0, 0], [4, 0, 4]])
    np.testing.assert_array_equal(ops.last_token_mask(m), [[0, 1, 0], [0, 0, 0], [0, 0, 1]])
    np.testing.assert_array_equal(ops.outcome_to_token_rewards(jnp.array([1.0, 5.0, 2.0]), m),
                                  [[0, 1, 0], [0, 0, 0], [0, 0, 2]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_turn_reduce_and_broadcast(self):
    x = jnp.array([[1.0, 2.0, 3.0, 4.0, 5.0]])
    tid = jnp.array([[0, 0, -1, 1, 1]])
    s = self.variant(ops.turn_reduce, static_argnums=(2,))(x, tid, 3)
    np.testing.assert_array_equal(s, [[3, 9, 0]])
    mean = ops.turn_reduce(x, tid, 3, reduce="mean")
    np.testing.assert_array_equal(mean, [[1.5, 4.5, 0]])
    back = self.variant(ops.turn_broadcast)(mean, tid)
    np.testing.assert_array_equal(back, [[1.5, 1.5, 0, 4.5, 4.5]])

  def test_turn_reduce_bad_mode(self):
    with pytest.raises(ValueError, match=r"reduce 'max'.*Known: \['count', 'mean', 'sum'\]"):
      ops.turn_reduce(jnp.ones((1, 2)), jnp.zeros((1, 2), jnp.int32), 1, reduce="max")


def test_every_public_name_is_re_exported():
  from credit.ops import groups, masked, returns, turns
  for mod in (masked, groups, returns, turns):
    for name in mod.__all__:
      assert getattr(ops, name) is getattr(mod, name), name
  assert len(set(ops.__all__)) == len(ops.__all__)


def test_turn_edges_first_and_last_token_of_each_turn():
  from credit.ops import turn_edges
  tid = np.array([[0, 0, 1, 1, 1, -1], [2, 2, 0, 0, 5, -1]], np.int32)
  mask = np.array([[1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 0]], bool)
  last = np.asarray(turn_edges(tid, mask, 3, last=True))
  first = np.asarray(turn_edges(tid, mask, 3, last=False))
  np.testing.assert_array_equal(last, [[0, 1, 0, 0, 1, 0], [0, 1, 0, 1, 0, 0]])
  np.testing.assert_array_equal(first, [[1, 0, 1, 0, 0, 0], [1, 0, 1, 0, 0, 0]])


def test_a_bool_mask_selects_exactly_as_its_float_form():
  """Boolean masks take `where` instead of a float copy: the same values (bit for bit for the
  sums, means and centred whitening; the scale-only whitening adds the mean back in another
  fusion, within an ulp), and masked NaN/inf entries still contribute nothing."""
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((64, 257)) * 3 + 100).astype(np.float32)
  m = rng.random((64, 257)) > 0.3
  x_bad = np.where(m, x, np.nan).astype(np.float32)
  for f in (lambda x, m: ops.masked_whiten(x, m), lambda x, m: ops.masked_mean(x, m, axis=-1),
            lambda x, m: ops.masked_sum(x, m, axis=0)):
    a, b = jax.jit(f)(x, m), jax.jit(f)(x, m.astype(np.float32))
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(jax.jit(f)(x_bad, m)))
  scale_only = jax.jit(lambda x, m: ops.masked_whiten(x, m, shift_mean=False))
  np.testing.assert_allclose(scale_only(x, m), scale_only(x, m.astype(np.float32)), rtol=2e-7)
  assert np.all(np.isfinite(scale_only(x_bad, m)))
