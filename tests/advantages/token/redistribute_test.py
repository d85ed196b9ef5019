"""Tests for the token family's redistribution primitive (credit/advantages/token/_redistribute.py).

The module is private (no registry entry), so the properties the registry-wide tests give
estimators for free are checked here directly: jit == eager, exact zeros outside the mask,
finite gradients, plus the budget / sign / fallback contract and a float64 numpy reference.
"""
from __future__ import annotations

import doctest

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from credit.advantages.token import _redistribute as rd

B, T = 8, 6


def ref_redistribute(adv, w, mask, renormalize, prior=0.0):
  """Float64 loop reference of A = Â·w̃·M with w̃ the budget-normalised weights."""
  out = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    ts = [t for t in range(mask.shape[1]) if mask[b, t]]
    L, tot = len(ts), sum(float(w[b, t]) for t in ts)
    for t in ts:
      if not renormalize:
        wt = float(w[b, t])
      elif tot + prior > 0:
        wt = (L * float(w[b, t]) + prior) / (tot + prior)
      else:
        wt = 1.0
      out[b, t] = float(adv[b]) * wt
  return out


@st.composite
def inputs(draw):
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  mask = rng.random((B, T)) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
  mask[0] = False  # always one empty row
  w = rng.uniform(0, 3, (B, T)).astype(np.float32)
  w = np.where(rng.random((B, T)) < 0.3, 0.0, w).astype(np.float32)
  w[1] = 0.0  # always one all-zero row
  adv = rng.choice([-1.5, -0.5, 0.0, 0.7, 2.0], B).astype(np.float32)
  return adv, w, mask


def test_doctests():
  res = doctest.testmod(rd, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


@pytest.mark.parametrize("renormalize", [False, True])
@hypothesis.settings(max_examples=20)
@hypothesis.given(x=inputs())
def test_matches_numpy_reference(renormalize, x):
  adv, w, mask = x
  got = np.asarray(rd.redistribute(adv, w, mask, renormalize=renormalize))
  np.testing.assert_allclose(got, ref_redistribute(adv, w, mask, renormalize),
                             rtol=1e-6, atol=1e-6)


@hypothesis.settings(max_examples=20)
@hypothesis.given(x=inputs())
def test_budget_sign_and_fallback(x):
  adv, w, mask = x
  a = np.asarray(rd.redistribute(adv, w, mask, renormalize=True), np.float64)
  lengths = mask.sum(-1)
  np.testing.assert_allclose(a.sum(-1), lengths * adv, rtol=1e-5, atol=1e-5)
  # Sign kept wherever the weight is positive; zero-sum rows are the plain broadcast.
  pos = mask & (w > 0)
  assert np.all(np.sign(a[pos]) == np.sign(np.broadcast_to(adv[:, None], mask.shape)[pos]))
  zero_rows = (np.where(mask, w, 0).sum(-1) == 0)
  np.testing.assert_array_equal(a[zero_rows],
                                np.where(mask, adv[:, None], 0.0)[zero_rows])
  assert np.all(a[~mask] == 0)


@hypothesis.settings(max_examples=10)
@hypothesis.given(x=inputs(), c=st.sampled_from([1e-3, 0.5, 7.0]))
def test_renormalised_weights_are_scale_invariant(x, c):
  adv, w, mask = x
  a1 = rd.redistribute(adv, w, mask, renormalize=True)
  a2 = rd.redistribute(adv, c * w, mask, renormalize=True)
  np.testing.assert_allclose(np.asarray(a1), np.asarray(a2), rtol=1e-5, atol=1e-6)


def test_exact_zeros_outside_mask_even_for_nan_weights():
  mask = np.array([[1, 1, 0], [0, 0, 0]], bool)
  w = np.array([[1., 2., np.nan], [np.inf, np.nan, 1.]], np.float32)
  for renormalize in (False, True):
    a = np.asarray(rd.redistribute(np.array([1., 3.]), w, mask, renormalize=renormalize))
    assert np.all(np.isfinite(a))
    assert a[0, 2] == 0 and np.all(a[1] == 0)
  np.testing.assert_allclose(np.asarray(rd.normalize_budget(w, mask)),
                             [[2 / 3, 4 / 3, 0.], [0., 0., 0.]], rtol=1e-6)


def test_normalize_budget_prior():
  mask = np.ones((3, 4), bool)
  w = np.array([[0., 0., 0., 0.], [1e-9, 0., 0., 3e-9], [1., 3., 0., 0.]], np.float32)
  no_prior = np.asarray(rd.normalize_budget(w, mask))
  np.testing.assert_allclose(no_prior, [[1, 1, 1, 1], [1, 0, 0, 3], [1, 3, 0, 0]], rtol=1e-6)
  # A prior far above the weight mass keeps a row near uniform; the budget holds exactly.
  with_prior = np.asarray(rd.normalize_budget(w, mask, prior=1e-6))
  np.testing.assert_allclose(with_prior[:2], np.ones((2, 4)), atol=1e-2)
  np.testing.assert_allclose(with_prior[2], [1, 3, 0, 0], atol=1e-5)
  np.testing.assert_allclose(with_prior.sum(-1), [4, 4, 4], rtol=1e-6)


def test_mix_with_uniform():
  rng = np.random.default_rng(0)
  mask = rng.random((B, T)) < 0.7
  s = np.where(rng.random((B, T)) < 0.4, 0.0, rng.uniform(0, 1, (B, T))).astype(np.float32)
  s[2] = 0.0
  budget = np.asarray(rd.normalize_budget(s, mask))
  np.testing.assert_array_equal(np.asarray(rd.mix_with_uniform(s, mask, alpha=0.0)),
                                mask.astype(np.float32))
  np.testing.assert_allclose(np.asarray(rd.mix_with_uniform(s, mask, alpha=1.0)), budget,
                             rtol=1e-6)
  for alpha in (0.3, 0.9):
    w = np.asarray(rd.mix_with_uniform(s, mask, alpha=alpha, prior=1e-6))
    assert np.all(w[mask] >= 1 - alpha - 1e-6) and np.all(w[~mask] == 0)
    np.testing.assert_allclose(w.sum(-1), mask.sum(-1), rtol=1e-5)


def test_jit_equals_eager_and_alpha_is_traceable():
  rng = np.random.default_rng(1)
  mask = rng.random((B, T)) < 0.7
  w = rng.uniform(0, 1, (B, T)).astype(np.float32)
  adv = rng.normal(size=B).astype(np.float32)
  for renormalize in (False, True):
    eager = rd.redistribute(adv, w, mask, renormalize=renormalize)
    jitted = jax.jit(rd.redistribute, static_argnames="renormalize")(
        adv, w, mask, renormalize=renormalize)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-6)
  sweep = jax.vmap(lambda a: rd.mix_with_uniform(w, mask, alpha=a))(jnp.array([0., 0.5, 1.]))
  assert sweep.shape == (3, B, T)
  np.testing.assert_allclose(np.asarray(sweep[1]),
                             np.asarray(rd.mix_with_uniform(w, mask, alpha=0.5)), rtol=1e-6)


def test_gradients_finite_on_degenerate_rows():
  mask = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], bool)
  w = jnp.array([[0., 0., 0.], [1., 0., 5.], [2., 3., 4.]])
  adv = jnp.array([1., -2., 3.])

  def f(adv, w):
    return jnp.sum(rd.redistribute(adv, w, mask, renormalize=True) ** 2)

  g_adv, g_w = jax.grad(f, argnums=(0, 1))(adv, w)
  assert np.all(np.isfinite(np.asarray(g_adv))) and np.all(np.isfinite(np.asarray(g_w)))
  assert np.all(np.asarray(g_w)[~mask] == 0)


def test_shape_checks():
  with pytest.raises(AssertionError):
    rd.redistribute(np.zeros(3), np.zeros((3, 4)), np.ones((3, 5), bool), renormalize=False)
  with pytest.raises(AssertionError):
    rd.redistribute(np.zeros(2), np.zeros((3, 4)), np.ones((3, 4), bool), renormalize=False)
