"""The paths taken for speed (benchmarks/estimators.py) give the outputs of the paths they
replace: the sequential reverse recurrence (XLA CPU) against the parallel one (accelerators)
and the float64 loop, to float32 rounding; bitwise: PRIME's undiscounted outcome return read
off the last token without a scan, GAE's next value by a shift, the optimal token baseline's
valid-index sums by position when a group's responses are aligned."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import ops
from credit.advantages.implicit.prime import prime_advantages
from credit.ops import returns
from tests.contract_fields import make_fields


def _loop(x, a):
  y = np.zeros(x.shape[:-1])
  out = np.zeros(x.shape)
  for t in reversed(range(x.shape[-1])):
    y = x[..., t] + a[..., t] * y
    out[..., t] = y
  return out


@pytest.mark.parametrize("shape", [(3, 1), (3, 7), (2, 16), (4, 1024), (2, 3, 1100)])
def test_sequential_recurrence_matches_parallel_and_loop(shape):
  rng = np.random.default_rng(sum(shape))
  x = rng.standard_normal(shape).astype(np.float32)
  a = np.where(rng.random(shape) < 0.3, 1.0, rng.choice([0.0, 0.95, 0.999], shape)
               ).astype(np.float32)
  seq = jax.jit(returns._sequential_reverse_recurrence)(x, a)
  par = jax.jit(returns._parallel_reverse_recurrence)(x, a)
  want = _loop(x.astype(np.float64), a.astype(np.float64))
  scale = 1.0 + np.abs(want)
  assert np.max(np.abs(np.asarray(seq) - want) / scale) < 2e-6
  assert np.max(np.abs(np.asarray(par) - want) / scale) < 2e-5
  # The dispatcher takes the sequential path on CPU.
  np.testing.assert_array_equal(jax.jit(returns._reverse_linear_recurrence)(x, a), seq)


def test_discounted_reverse_cumsum_vmap_and_grad_on_the_sequential_path():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 37)).astype(np.float32)
  m = rng.random((3, 37)) > 0.3
  f = jax.jit(jax.vmap(ops.discounted_reverse_cumsum, in_axes=(None, None, 0)))
  got = f(x, m, jnp.array([0.0, 0.9, 1.0]))
  for g, out in zip((0.0, 0.9, 1.0), got):
    want = np.where(m, _loop(np.where(m, x, 0.0), np.where(m, g, 1.0)), 0.0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
  grad = jax.grad(lambda x_: ops.discounted_reverse_cumsum(x_, m, 0.9)[0, 0])(jnp.asarray(x))
  valid = np.flatnonzero(m[0])
  want_g = np.zeros(37)
  if m[0, 0]:
    want_g[valid] = 0.9 ** np.arange(len(valid))
  np.testing.assert_allclose(grad[0], want_g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("holes", [False, True])
def test_prime_undiscounted_outcome_without_a_scan_agrees_with_the_scan(holes):
  """gamma_outcome = 1 (static) takes one complex cumulative sum instead of the scan; the two
  differ only in float32 summation order (measured: at most 2 ulp)."""
  f = make_fields(3, holes=holes)
  kw = dict(reward=f["reward"], group_id=f["group_id"], response_mask=f["response_mask"],
            logprob_prm=f["logprob_prm"], logprob_ref=f["logprob_ref"], num_groups=4,
            group_size=4)
  fast = jax.jit(lambda: prime_advantages(**kw, gamma_outcome=1.0))()
  scan = jax.jit(lambda g: prime_advantages(**kw, gamma_outcome=g))(jnp.float32(1.0))
  np.testing.assert_allclose(fast, scan, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("holes", [False, True])
def test_gae_next_value_shift_equals_the_gather_at_valid_positions(holes):
  from credit.ops import baselines
  f = make_fields(5, holes=holes, dims={"T": 11})
  m = f["response_mask"]
  v = np.where(m, f["values"], 0.0).astype(np.float32)
  want = np.where(m, ops.next_valid_value(v, m), 0.0)
  got = jax.jit(baselines._next_value_at_valid)(jnp.asarray(v), jnp.asarray(m))
  np.testing.assert_array_equal(np.where(m, got, 0.0), want)
  # Under vmap the batch predicate is per example: each takes its own branch's values.
  both = jax.vmap(baselines._next_value_at_valid)(jnp.stack([v, v]), jnp.stack([m, m]))
  np.testing.assert_array_equal(np.where(m, both[1], 0.0), want)


@pytest.mark.parametrize("holes", [False, True])
def test_otb_valid_index_sums_by_position_when_aligned(holes):
  from credit.advantages.outcome.optimal_token_baseline import (
      optimal_token_baseline_advantages as otb)
  f = make_fields(7, holes=holes)
  kw = dict(reward=f["reward"], group_id=f["group_id"], response_mask=f["response_mask"],
            logprob_old=f["logprob_old"], sum_pi_squared=f["sum_pi_squared"], num_groups=4)
  for gs in (4, None):
    tir = jax.jit(lambda: otb(**kw, group_size=gs, align="valid_index"))()
    pos = jax.jit(lambda: otb(**kw, group_size=gs, align="position"))()
    if not holes:   # one run per row starting at 0: the valid index is the position
      np.testing.assert_array_equal(tir, pos)
    else:           # holes: the keyed sums (index among valid tokens) differ from positions
      assert not np.array_equal(tir, pos)
  # Shifted starts within a group (one run each, different prompt lengths): keyed sums.
  m = f["response_mask"].copy()
  m[1] = np.roll(m[1], 1)
  m[1, 0] = False
  kw2 = dict(kw, response_mask=m)
  tir = jax.jit(lambda: otb(**kw2, group_size=4, align="valid_index"))()
  pos = jax.jit(lambda: otb(**kw2, group_size=4, align="position"))()
  assert np.isfinite(np.asarray(tir)).all()
  if m[1].any() and m[1].sum() < m.shape[1]:
    assert not np.array_equal(tir, pos)
