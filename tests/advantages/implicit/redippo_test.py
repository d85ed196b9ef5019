"""Tests for ReDiPPO (credit/advantages/implicit/redippo.py).
Float64 loop reference from the formulas; registry-wide properties in
tests/registry_common_test.py."""
from __future__ import annotations

import doctest
import functools

import chex
import hypothesis
import jax
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import strategies as st

from credit import contract, registry
from credit.advantages.implicit import redippo as rd
from credit.advantages.outcome import gae_advantages

B, T = 6, 7


def ref_gae(reward, values, mask, gamma, lam):
  adv = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    nextv, last, first = 0.0, 0.0, True
    for t in reversed(range(mask.shape[1])):
      if not mask[i, t]:
        continue
      delta = (float(reward[i]) if first else 0.0) + gamma * nextv - float(values[i, t])
      last = delta + gamma * lam * last
      nextv, first = float(values[i, t]), False
      adv[i, t] = last
  return adv, np.where(mask, adv + values, 0.0)


def ref_weights(values, values_ref, mask, beta=0.5, w_min=0.0, w_max=3.0):
  d = np.where(mask, np.abs(values_ref.astype(np.float64) - values), 0.0)
  mean = d[mask].mean() if mask.any() else 0.0
  return np.where(mask, np.clip(1.0 + beta * d / (mean + 1e-8), w_min, w_max), 0.0)


def whiten_np(x, mask):
  v = x[mask]
  if v.size < 2:
    return np.zeros_like(x)
  return np.where(mask, (x - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-8), 0.0)


def ref(reward, values, values_ref, mask, gamma=1.0, lam=0.95, beta=0.5, w_min=0.0, w_max=3.0,
        whiten="before"):
  adv, ret = ref_gae(reward, values_ref.astype(np.float64), mask, gamma, lam)
  w = ref_weights(values, values_ref, mask, beta, w_min, w_max)
  if whiten == "before":
    a = w * whiten_np(adv, mask)
  elif whiten == "after":
    a = whiten_np(w * adv, mask)
  else:
    a = w * adv
  return a, ret, w


@st.composite
def batches(draw):
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):                       # observation tokens inside responses
    mask &= rng.random((B, T)) > 0.3
  reward = rng.choice([0.0, 1.0, 0.5], B).astype(np.float32)
  values = rng.uniform(-1, 1, (B, T)).astype(np.float32)
  scale = draw(st.sampled_from([0.0, 0.1, 1.0]))   # 0: the critics agree on some tokens
  values_ref = (values + scale * rng.normal(size=(B, T)) * (rng.random((B, T)) > 0.3)
                ).astype(np.float32)
  return dict(reward=reward, values=values, values_ref=values_ref, response_mask=mask)


@functools.lru_cache(maxsize=None)
def jitted(whiten):
  return jax.jit(functools.partial(rd.redippo_advantages, whiten=whiten))


def test_registered_and_doctest():
  spec = registry.get_estimator("redippo")
  assert spec.family == "implicit" and spec.confidence == "inferred" and spec.returns_output
  assert spec.needs == {"reward", "values", "values_ref", "response_mask"}
  assert spec.static_argnames == ("whiten",)
  res = doctest.testmod(rd, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example_weights():
  # §24.6: V_std = [.5, .6, .2], V_ref = [.5, .9, .1] -> d = [0, .3, .1], mean 0.133333.
  w = rd.redippo_weights(values=np.array([[.5, .6, .2]], np.float32),
                         values_ref=np.array([[.5, .9, .1]], np.float32),
                         response_mask=np.ones((1, 3), bool))
  np.testing.assert_allclose(np.asarray(w), [[1.0, 2.125, 1.375]], atol=1e-5)
  adv_hat = np.array([[0.4, 0.2, -0.1]], np.float32)   # the worked example feeds Â directly
  np.testing.assert_allclose(np.asarray(w) * adv_hat, [[0.4, 0.425, -0.1375]], atol=1e-5)


def test_weights_clip_and_mask():
  v = np.zeros((1, 4), np.float32)
  vr = np.array([[0., 0., 0., 10.]], np.float32)      # d/mean = 4 on the last token
  m = np.array([[1, 1, 1, 1]], bool)
  w = np.asarray(rd.redippo_weights(values=v, values_ref=vr, response_mask=m))
  np.testing.assert_allclose(w, [[1., 1., 1., 3.]])   # 1 + 0.5·4 = 3 = w_max
  w = np.asarray(rd.redippo_weights(values=v, values_ref=vr, response_mask=m, beta=-1.0))
  np.testing.assert_allclose(w, [[1., 1., 1., 0.]])   # 1 − 4 clipped at w_min = 0
  m = np.array([[1, 1, 0, 0]], bool)
  w = np.asarray(rd.redippo_weights(values=v, values_ref=np.where(m, vr, np.nan), response_mask=m))
  np.testing.assert_array_equal(w, [[1., 1., 0., 0.]])


@pytest.mark.parametrize("whiten", rd.WHITEN_MODES)
@hypothesis.settings(max_examples=15)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(whiten, data):
  b = data.draw(batches())
  out = jitted(whiten)(**b)
  adv, ret, w = ref(b["reward"], b["values"], b["values_ref"], b["response_mask"],
                    whiten=whiten)
  np.testing.assert_allclose(np.asarray(out.weights), w, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.returns), ret, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.advantages), adv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("whiten", rd.WHITEN_MODES)
def test_reduces_to_gae_when_the_critics_agree(whiten):
  # d ≡ 0 -> w ≡ 1 exactly, so the result is GAE on V_ref, bit for bit.
  rng = np.random.default_rng(3)
  mask = np.arange(T)[None, :] < rng.integers(1, T + 1, B)[:, None]
  mask[2, 1] = False
  values = rng.uniform(-1, 1, (B, T)).astype(np.float32)
  reward = rng.choice([0., 1.], B).astype(np.float32)
  out = rd.redippo_advantages(reward=reward, values=values, values_ref=values,
                              response_mask=mask, whiten=whiten)
  want = gae_advantages(reward=reward, values=values, response_mask=mask, lam=0.95,
                        whiten=whiten != "none")
  np.testing.assert_array_equal(np.asarray(out.weights), mask.astype(np.float32))
  np.testing.assert_array_equal(np.asarray(out.advantages), np.asarray(want.advantages))
  np.testing.assert_array_equal(np.asarray(out.returns), np.asarray(want.returns))


def test_padding_columns_change_nothing():
  rng = np.random.default_rng(5)
  mask = np.arange(T)[None, :] < rng.integers(0, T + 1, B)[:, None]
  kw = dict(reward=rng.choice([0., 1.], B).astype(np.float32),
            values=rng.uniform(-1, 1, (B, T)).astype(np.float32),
            values_ref=rng.uniform(-1, 1, (B, T)).astype(np.float32), response_mask=mask)
  pad = lambda x, fill: np.concatenate([x, np.full((B, 3), fill, x.dtype)], axis=1)
  padded = dict(kw, values=pad(kw["values"], np.nan), values_ref=pad(kw["values_ref"], np.inf),
                response_mask=pad(mask, False))
  for whiten in rd.WHITEN_MODES:
    want = rd.redippo_advantages(**kw, whiten=whiten)
    got = rd.redippo_advantages(**padded, whiten=whiten)
    for w_, g_ in zip(want, got):
      g_ = np.asarray(g_)
      assert np.all(g_[:, T:] == 0.0)
      np.testing.assert_allclose(g_[:, :T], np.asarray(w_), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("whiten", rd.WHITEN_MODES)
def test_degenerate_inputs_are_finite(whiten):
  # All-equal rewards and values (d ≡ 0, Â constant), a single token, an empty mask.
  ones = np.ones((B, T), np.float32)
  for mask in (np.ones((B, T), bool), np.eye(1, T, dtype=bool).repeat(B, 0),
               np.zeros((B, T), bool)):
    for vr in (0.3 * ones, 0.3 * ones + 1e-7):
      out = rd.redippo_advantages(reward=np.full(B, 0.7, np.float32), values=0.3 * ones,
                                  values_ref=vr, response_mask=mask, whiten=whiten)
      for x in out:
        assert np.all(np.isfinite(np.asarray(x)))
        assert np.all(np.asarray(x)[~mask] == 0.0)
  single = rd.redippo_advantages(reward=np.ones(1, np.float32), values=np.zeros((1, 1)),
                                 values_ref=np.full((1, 1), 0.5), response_mask=np.ones((1, 1)),
                                 whiten=whiten)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in single)
  np.testing.assert_allclose(np.asarray(single.weights), [[1.5]], rtol=1e-6)
  g = jax.grad(lambda v, r: rd.redippo_advantages(
      reward=np.ones(B, np.float32), values=v, values_ref=r, response_mask=np.ones((B, T), bool),
      whiten=whiten).advantages.sum(), argnums=(0, 1))(0.3 * ones, 0.3 * ones)
  assert all(np.all(np.isfinite(np.asarray(x))) for x in g)


class JitTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager(self):
    rng = np.random.default_rng(7)
    mask = rng.random((B, T)) > 0.3
    kw = dict(reward=rng.choice([0., 1.], B).astype(np.float32),
              values=rng.uniform(-1, 1, (B, T)).astype(np.float32),
              values_ref=rng.uniform(-1, 1, (B, T)).astype(np.float32), response_mask=mask)
    f = self.variant(functools.partial(rd.redippo_advantages, whiten="after"))
    got = f(**kw, beta=0.7, w_max=2.0)
    want = ref(kw["reward"], kw["values"], kw["values_ref"], mask, beta=0.7, w_max=2.0,
               whiten="after")
    for g_, w_ in zip(got, want):
      np.testing.assert_allclose(np.asarray(g_), w_, rtol=1e-4, atol=1e-5)


def test_bad_input_raises_before_tracing():
  kw = dict(reward=np.zeros(B, np.float32), values=np.zeros((B, T), np.float32),
            response_mask=np.ones((B, T), bool))
  with pytest.raises(AssertionError):
    rd.redippo_advantages(values_ref=np.zeros((B, T + 1), np.float32), **kw)
  with pytest.raises(AssertionError):
    jax.jit(rd.redippo_advantages)(values_ref=np.zeros((B, T + 1), np.float32), **kw)
  with pytest.raises(ValueError, match="whiten"):
    rd.redippo_advantages(values_ref=np.zeros((B, T), np.float32), whiten=True, **kw)
  nan = np.zeros((B, T), np.float32)
  nan[1, 2] = np.nan
  with pytest.raises(contract.ContractError, match="`values_ref` contains NaN"):
    contract.validate_fields(dict(kw, values_ref=nan))
  with pytest.raises(contract.ContractError, match="`values_ref` has shape"):
    contract.validate_fields(dict(kw, values_ref=np.zeros((B, T + 1), np.float32)))
  kw["response_mask"] = np.ones((B, T), bool)
  kw["response_mask"][1, 2] = False                  # NaN under the mask is allowed
  contract.validate_fields(dict(kw, values_ref=nan))


def test_block_recurrence_equals_the_scan():
  # Rows long enough for the block products of `ops.discounted_reverse_cumsum`.
  from credit import ops
  rng = np.random.default_rng(0)
  b, t = 4, ops.returns.FAST_RECURRENCE_MIN_T + 20
  mask = np.arange(t)[None] < rng.integers(1, t + 1, b)[:, None]
  reward = rng.choice([0.0, 1.0], b).astype(np.float32)
  v = rng.uniform(-1, 1, (b, t)).astype(np.float32)
  vr = rng.uniform(-1, 1, (b, t)).astype(np.float32)
  out = jax.jit(lambda r, v, vr, m: rd.redippo_advantages(
      reward=r, values=v, values_ref=vr, response_mask=m))(reward, v, vr, mask)
  gae = ops.gae("test", reward=reward, values=vr, response_mask=mask, lam=0.95)
  w = rd.redippo_weights(values=v, values_ref=vr, response_mask=mask)
  np.testing.assert_allclose(np.asarray(out.advantages), np.asarray(w * gae.advantages),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.returns), np.asarray(gae.returns), rtol=1e-5,
                             atol=1e-5)
