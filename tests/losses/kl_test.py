"""Tests of credit.losses.kl: per-token KL estimators, straight-through variants, KL loss/reward."""
import inspect
import math

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, strategies as st

from credit import losses
from credit.losses import kl

B, T = 4, 5
BASE = ["k1", "k2", "k3", "abs"]


def np_kl(lp, ref, kind):
  d = np.clip(np.asarray(lp, np.float64) - ref, -20, 20)
  kind = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}.get(kind.rstrip("+"), kind.rstrip("+"))
  if kind == "k1":
    return d
  if kind == "abs":
    return np.abs(d)
  if kind == "k2":
    return 0.5 * d * d
  return np.clip(np.exp(-d) + d - 1.0, -10, 10)


_kl_jit = jax.jit(kl.kl_penalty, static_argnames="kind")

logps = hnp.arrays(np.float32, (B, T), elements=st.floats(-30, 0, width=32))


class KLPenaltyTest(parameterized.TestCase):

  def test_spec_k3_example(self):
    # Worked example: log π = −0.7, log π_ref = −1.0 → x = −0.3 → k3 = e^x − x − 1 = 0.040818.
    np.testing.assert_allclose(kl.kl_penalty(jnp.array(-0.7), jnp.array(-1.0), "k3"),
                               0.040818, atol=1e-6)
    np.testing.assert_allclose(kl.kl_penalty(jnp.array(-0.7), jnp.array(-1.0), "k1"), 0.3,
                               atol=1e-6)

  @given(lp=logps, ref=logps, kind=st.sampled_from(list(kl.KL_KINDS)))
  def test_values_match_numpy(self, lp, ref, kind):
    np.testing.assert_allclose(_kl_jit(lp, ref, kind=kind), np_kl(lp, ref, kind), rtol=1e-5,
                               atol=1e-5)

  @parameterized.parameters(*BASE)
  def test_straight_through_has_value_of_kind_and_gradient_of_k2(self, kind):
    rng = np.random.default_rng(0)
    lp = rng.normal(size=(B, T)).astype(np.float32) - 1
    ref = rng.normal(size=(B, T)).astype(np.float32) - 1
    f = lambda k: lambda x: jnp.sum(kl.kl_penalty(x, ref, k))
    np.testing.assert_allclose(kl.kl_penalty(lp, ref, kind + "+"), kl.kl_penalty(lp, ref, kind),
                               rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f(kind + "+"))(lp), lp - ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.grad(f("k2"))(lp), lp - ref, rtol=1e-5, atol=1e-6)

  @parameterized.parameters(*BASE)
  def test_gradients_of_estimators(self, kind):
    # d/dlogπ: k1 → 1, abs → sign, k2 → d, k3 → 1 − e^{−d}; nothing flows to log π_ref.
    lp = jnp.array([[-0.5, -2.0]])
    ref = jnp.array([[-1.0, -1.0]])
    d = np.asarray(lp - ref)
    want = {"k1": np.ones_like(d), "abs": np.sign(d), "k2": d, "k3": 1 - np.exp(-d)}[kind]
    g_lp, g_ref = jax.grad(lambda a, b: jnp.sum(kl.kl_penalty(a, b, kind)), (0, 1))(lp, ref)
    np.testing.assert_allclose(g_lp, want, rtol=1e-6)
    np.testing.assert_array_equal(g_ref, 0.0)

  def test_clamps_are_finite_on_extreme_log_ratios(self):
    lp = jnp.array([[-80.0, 0.0, -1.0, 0.0]])
    ref = jnp.array([[0.0, -80.0, -1.0, -30.0]])
    for kind in kl.KL_KINDS:
      v = kl.kl_penalty(lp, ref, kind)
      g = jax.grad(lambda x: jnp.sum(kl.kl_penalty(x, ref, kind)))(lp)
      assert np.all(np.isfinite(v)) and np.all(np.isfinite(g)), kind
    k3 = kl.kl_penalty(lp, ref, "k3")
    # d = −80 clamps to −20: e^{20} − 21 is above 10 → 10; d = +80 → 20 + e^{−20} − 1 → 10.
    np.testing.assert_allclose(k3, [[10.0, 10.0, 0.0, 10.0]])
    np.testing.assert_allclose(kl.kl_penalty(lp, ref, "k1"), [[-20.0, 20.0, 0.0, 20.0]])

  def test_unknown_kind_lists_known(self):
    with pytest.raises(ValueError, match="low_var_kl"):
      kl.kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_loss_aggregates_masked_and_matches_numpy(self):
    rng = np.random.default_rng(1)
    lp = (rng.normal(size=(B, T)) - 1).astype(np.float32)
    ref = (rng.normal(size=(B, T)) - 1).astype(np.float32)
    m = rng.random((B, T)) > 0.3
    lp_nan = np.where(m, lp, np.nan).astype(np.float32)
    f = self.variant(lambda a, b, mm: kl.kl_loss(logprob=a, logprob_ref=b, response_mask=mm))
    out = f(lp_nan, ref, m)
    want = np_kl(lp, ref, "k3")[m].mean()
    np.testing.assert_allclose(out.loss, want, rtol=1e-5)
    np.testing.assert_allclose(out.metrics["kl"], want, rtol=1e-5)
    np.testing.assert_allclose(out.metrics["kl_k1"], (lp - ref)[m].mean(), rtol=1e-5)
    g = jax.grad(lambda a: f(a, ref, m).loss)(lp_nan)
    np.testing.assert_allclose(g, np.where(m, 1 - np.exp(-(lp - ref)), 0) / m.sum(),
                               rtol=1e-5, atol=1e-7)

  def test_kl_loss_modes_and_microbatches(self):
    rng = np.random.default_rng(2)
    lp = (rng.normal(size=(B, T)) - 1).astype(np.float32)
    ref = (rng.normal(size=(B, T)) - 1).astype(np.float32)
    m = np.arange(T)[None, :] < np.array([[5], [0], [3], [1]])
    for mode in losses.AGG_MODES:
      f = lambda a, b, mm, **kw: kl.kl_loss(logprob=a, logprob_ref=b, response_mask=mm,
                                            kind="k2", loss_agg_mode=mode, norm_constant=6.0,
                                            **kw).loss
      full = f(lp, ref, m)
      kw = dict(num_tokens_global=m.sum(), num_seqs_global=m.any(1).sum())
      micro = f(lp[:2], ref[:2], m[:2], **kw) + f(lp[2:], ref[2:], m[2:], **kw)
      np.testing.assert_allclose(micro, full, rtol=1e-5, err_msg=mode)
      want = losses.aggregate_loss(np_kl(lp, ref, "k2").astype(np.float32), m, mode,
                                   norm_constant=6.0)
      np.testing.assert_allclose(full, want, rtol=1e-6, err_msg=mode)


def test_kl_in_reward_k1_and_masking():
  # PPO KL-in-reward: r − β·(log π_old − log π_ref), zero outside the mask, no gradient.
  r = np.zeros((2, 3), np.float32)
  r[0, 1] = 1.0
  old = np.log(np.array([[0.5, 0.4, 0.3], [0.2, 0.2, 0.2]], np.float32))
  ref = np.log(np.array([[0.25, 0.4, 0.6], [0.1, 0.2, 0.2]], np.float32))
  m = np.array([[1, 1, 0], [1, 0, 0]], bool)
  got = kl.kl_in_reward(token_reward=r, logprob_old=old, logprob_ref=ref, coef=0.1,
                        response_mask=m)
  want = np.where(m, r - 0.1 * (old - ref), 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got[0, 0], -0.1 * math.log(2), rtol=1e-6)
  unmasked = kl.kl_in_reward(token_reward=r, logprob_old=old, logprob_ref=ref, coef=0.1)
  np.testing.assert_allclose(unmasked, r - 0.1 * (old - ref), rtol=1e-6, atol=1e-7)
  g = jax.grad(lambda o, f, c: jnp.sum(kl.kl_in_reward(token_reward=r, logprob_old=o,
                                                       logprob_ref=f, coef=c, kind="k3")),
               (0, 1))(old, ref, 0.1)
  np.testing.assert_array_equal(g[0], 0.0)
  np.testing.assert_array_equal(g[1], 0.0)
  # A traced coefficient (adaptive controller) under jit.
  f = jax.jit(lambda c: kl.kl_in_reward(token_reward=r, logprob_old=old, logprob_ref=ref,
                                        coef=c, response_mask=m))
  np.testing.assert_allclose(f(0.1), want, rtol=1e-6, atol=1e-7)


def test_kinds_and_the_runner_facing_signatures():
  assert set(kl.KL_KINDS) == {"k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl",
                              "k1+", "k2+", "k3+", "abs+", "kl+", "mse+", "low_var_kl+"}
  assert losses.kl_loss is kl.kl_loss and losses.KL_KINDS is kl.KL_KINDS
  params = inspect.signature(losses.kl_loss).parameters
  assert list(params) == ["logprob", "logprob_ref", "response_mask", "kind", "loss_agg_mode",
                          "num_tokens_global", "num_seqs_global", "norm_constant"]
  assert all(p.kind is p.KEYWORD_ONLY for p in params.values())
  # k2+ is k2 itself; the aliases are their estimators.
  lp, ref = jnp.array([[-0.5, -2.0]]), jnp.array([[-1.0, -1.0]])
  for a, b in [("k2+", "k2"), ("mse", "k2"), ("kl", "k1"), ("low_var_kl+", "k3+")]:
    np.testing.assert_array_equal(kl.kl_penalty(lp, ref, a), kl.kl_penalty(lp, ref, b))
