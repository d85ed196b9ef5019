"""Tests for the OPSA estimator (credit/advantages/token/opsa.py).

Source: the authors' code DripNowhy/On-Policy-Self-Adaptation, `slime/tests/test_opsa.py`
(the unit tests of `compute_opsa`; arXiv 2608.31046 §4.2). The worked examples below are
that file's cases;
the numpy reference is written from the formula (float64 loops, a stable sort).
Registry-wide properties live in tests/registry_common_test.py.
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

from credit import registry
from credit.advantages.token import opsa as op
from tests.advantages.token._harness import reference_test, run, table
from tests.advantages.token._ref import B, T, batches, pick

CONFIGS = {
    "default": dict(),
    "fraction": dict(token_fraction=0.5, adv_min=-2.0, adv_max=-0.25),
    "fixed": dict(mode="fixed", fixed_advantage=-0.5),
    "fixed_positive": dict(mode="fixed", fixed_advantage=0.2, token_fraction=0.1),
}
FIELDS = ("response_mask", "entropy", "logprob_old")


def ref_opsa(b, *, token_fraction=0.2, adv_min=-1.0, adv_max=-0.5, fixed_advantage=-0.5,
             mode="entropy"):
  mask = b["response_mask"]
  lp = b["logprob_old"].astype(np.float64)
  ent = b["entropy"].astype(np.float64)
  pool = [(lp[i, t], i * mask.shape[1] + t, i, t) for i in range(mask.shape[0])
          for t in range(mask.shape[1]) if mask[i, t]]
  adv = np.zeros(mask.shape)
  sel = np.zeros(mask.shape, bool)
  if not pool:
    return adv, sel
  k = max(1, int(np.floor(token_fraction * len(pool) + 1e-9)))
  chosen = sorted(pool)[:k]                 # by log-prob, ties by flat index (stable)
  hs = [ent[i, t] for _, _, i, t in chosen]
  lo, hi = min(hs), max(hs)
  for _, _, i, t in chosen:
    sel[i, t] = True
    if mode == "fixed":
      adv[i, t] = fixed_advantage
    else:
      r = (ent[i, t] - lo) / (hi - lo) if hi > lo else 1.0
      adv[i, t] = adv_max + (adv_min - adv_max) * r
  return adv, sel


# Outputs (advantages, loss_mask): the selection is compared exactly.
CASES = table(op.opsa_advantages, FIELDS, ref_opsa, CONFIGS, group=False, rtol=1e-5, atol=1e-6)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES, max_examples=12)


def _call(lp, mask, ent=None, **kw):
  lp = np.asarray(lp, np.float32)
  ent = np.zeros_like(lp) if ent is None else np.asarray(ent, np.float32)
  out = op.opsa_advantages(response_mask=np.asarray(mask, bool), logprob_old=lp, entropy=ent,
                           **kw)
  return np.asarray(out.advantages), np.asarray(out.loss_mask)


def test_registered_in_token_family():
  spec = registry.get_estimator("opsa")
  assert spec.family == "token" and spec.confidence == "code-verified"
  assert spec.returns_output and spec.fn is op.opsa_advantages
  assert spec.needs == set(FIELDS)
  assert "2608.31046" in spec.paper


def test_doctests():
  res = doctest.testmod(op, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example_from_the_code_tests():
  # test_entropy_opsa_selects_lowest_valid_tokens_across_packed_samples: the packed samples
  # [−10, −9 (masked), −8] and [−7, −6] as two padded rows; f = 0.5 → N = 4, K = 2.
  adv, sel = _call([[-10., -9., -8.], [-7., -6., 0.]], [[1, 0, 1], [1, 1, 0]],
                   [[2., 99., 4.], [3., 1., 0.]], token_fraction=0.5)
  np.testing.assert_allclose(adv, [[-0.5, 0.0, -1.0], [0.0, 0.0, 0.0]])
  np.testing.assert_array_equal(sel, [[1, 0, 1], [0, 0, 0]])
  # test_equal_selected_entropies_receive_advantage_min.
  adv, _ = _call([[-4., -3., -2., -1.]], np.ones((1, 4)), np.full((1, 4), 2.0),
                 token_fraction=0.5)
  np.testing.assert_array_equal(adv, [[-1.0, -1.0, 0.0, 0.0]])
  # test_fixed_negative_and_positive_advantages.
  for value in (-0.5, 0.2):
    adv, _ = _call([[-3., -2., -1.]], np.ones((1, 3)), mode="fixed", fixed_advantage=value,
                   token_fraction=2 / 3)
    np.testing.assert_allclose(adv, [[value, value, 0.0]])


@pytest.mark.parametrize("fraction,count", [(0.1, 1), (0.2, 2), (0.3, 3), (0.4, 4)])
def test_lowest_fraction_ablations(fraction, count):
  # test_lowest_fraction_ablations / test_nonempty_batch_always_selects_at_least_one_token.
  _, sel = _call(np.arange(10, dtype=np.float32)[None], np.ones((1, 10)), mode="fixed",
                 token_fraction=fraction)
  assert sel.sum() == count and sel[0, :count].all()
  _, sel = _call([[-1.0, -0.5]], np.ones((1, 2)), mode="fixed", token_fraction=0.1)
  np.testing.assert_array_equal(sel, [[True, False]])


def test_empty_batch_selects_nothing():
  adv, sel = _call(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3)))
  assert np.all(adv == 0.0) and not sel.any()


def test_selection_is_one_pool_over_the_batch():
  # The code's pool is a data-parallel rank's batch (test_selection_is_dp_local_not_global);
  # here it is the whole batch given: both tokens of the first row are chosen.
  _, sel = _call([[-100., -90.], [-2., -1.]], np.ones((2, 2)), mode="fixed",
                 token_fraction=0.5)
  np.testing.assert_array_equal(sel, [[True, True], [False, False]])


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_bounds_and_fixed_reduction(b):
  kw = pick(b, *FIELDS)
  out = op.opsa_advantages(**kw)
  adv, sel = np.asarray(out.advantages), np.asarray(out.loss_mask)
  assert not (sel & ~b["response_mask"]).any()
  assert np.all(adv[sel] <= -0.5 + 1e-6) and np.all(adv[sel] >= -1.0 - 1e-6)
  assert np.all(adv[~sel] == 0.0)
  # A_min = A_max = c is the fixed mode with c.
  same = op.opsa_advantages(adv_min=-0.7, adv_max=-0.7, **kw)
  fixed = op.opsa_advantages(mode="fixed", fixed_advantage=-0.7, **kw)
  np.testing.assert_allclose(np.asarray(same.advantages), np.asarray(fixed.advantages),
                             atol=1e-6)
  np.testing.assert_array_equal(np.asarray(same.loss_mask), np.asarray(fixed.loss_mask))


def test_vmap_over_token_fraction():
  rng = np.random.default_rng(0)
  kw = dict(response_mask=np.ones((B, T), bool),
            logprob_old=rng.normal(size=(B, T)).astype(np.float32),
            entropy=rng.uniform(0, 2, (B, T)).astype(np.float32))
  fr = np.array([0.1, 0.2, 0.5], np.float32)
  counts = jax.vmap(lambda f: op.opsa_advantages(token_fraction=f, **kw).loss_mask.sum())(fr)
  np.testing.assert_array_equal(np.asarray(counts), np.floor(fr * B * T + 1e-4).astype(int))


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="constant"), "mode"),
    (dict(token_fraction=0.0), "token_fraction"),
    (dict(token_fraction=1.1), "token_fraction"),
    (dict(adv_min=-0.5, adv_max=-1.0), "adv_min"),
    (dict(mode="fixed", fixed_advantage=0.0), "fixed_advantage"),
])
def test_bad_args_raise(kwargs, match):
  base = dict(response_mask=np.ones((B, T), bool), entropy=np.ones((B, T), np.float32),
              logprob_old=np.zeros((B, T), np.float32))
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    op.opsa_advantages(**base)


def test_shape_mismatch_raises():
  with pytest.raises(AssertionError):
    op.opsa_advantages(response_mask=np.ones((B, T), bool),
                       entropy=np.ones((B, T + 1), np.float32),
                       logprob_old=np.zeros((B, T), np.float32))


def _sort_based_select(*, response_mask, logprob_old, token_fraction=0.2):
  """The former `opsa_select` (a stable argsort of the batch), the reference the sort-free
  selection must reproduce exactly."""
  mask_BT = jnp.asarray(response_mask).astype(bool)
  lp_BT = jnp.asarray(logprob_old, jnp.float32)
  key = jax.lax.stop_gradient(jnp.where(mask_BT, lp_BT, jnp.inf)).reshape(-1)
  order = jnp.argsort(key, stable=True)
  rank = jnp.zeros(key.shape, jnp.int32).at[order].set(jnp.arange(key.shape[0], dtype=jnp.int32))
  n = jnp.sum(mask_BT.astype(jnp.int32))
  frac = jnp.asarray(token_fraction, jnp.float32)
  k = jnp.floor(frac * n.astype(jnp.float32) + 1e-4).astype(jnp.int32)
  k = jnp.where(n > 0, jnp.maximum(k, 1), 0)
  return (rank.reshape(mask_BT.shape) < k) & mask_BT


# Log-probs with ties, ±0, positive and large-magnitude values, and ±inf.
_LOGPROB_POOL = np.array([0.0, -0.0, -1.0, -1.0, -2.5, 1.0, -3e38, 3e38, -np.inf, np.inf],
                         np.float32)


@functools.lru_cache(maxsize=None)
def _jitted_sort_based_opsa(name):
  """OPSA with the former sort-based selection, traced (once, cached) under the patch."""
  fn = jax.jit(functools.partial(op.opsa_advantages, **CONFIGS[name]))

  def call(**kw):
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(op, "opsa_select", _sort_based_select)
      return fn(**kw)
  return call


@functools.lru_cache(maxsize=None)
def _jitted_select(frac, sort_based):
  fn = _sort_based_select if sort_based else op.opsa_select
  return jax.jit(functools.partial(fn, token_fraction=frac))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=5, deadline=None)
@hypothesis.given(data=st.data())
def test_equals_the_sort_based_selection_exactly(name, data):
  b = data.draw(batches())
  rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
  lp = np.where(rng.random((B, T)) < data.draw(st.sampled_from([0.3, 1.0])),
                rng.choice(_LOGPROB_POOL, (B, T)), b["logprob_old"]).astype(np.float32)
  mask = b["response_mask"]
  if data.draw(st.booleans()):   # a single valid token in the batch
    mask = np.zeros_like(mask)
    mask[rng.integers(B), rng.integers(T)] = True
  kw = dict(pick(b, *FIELDS), logprob_old=lp, response_mask=mask)
  got_adv, got_sel = run(CASE[name], kw)
  want = _jitted_sort_based_opsa(name)(**kw)
  np.testing.assert_array_equal(got_sel, np.asarray(want.loss_mask))
  np.testing.assert_array_equal(got_adv, np.asarray(want.advantages))
  frac = CONFIGS[name].get("token_fraction", 0.2)
  np.testing.assert_array_equal(
      np.asarray(_jitted_select(frac, False)(response_mask=mask, logprob_old=lp)),
      np.asarray(_jitted_select(frac, True)(response_mask=mask, logprob_old=lp)))
