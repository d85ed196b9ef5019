"""DPPO's Binary-TV and Binary-KL losses against a numpy transcription of verl's code
(`compute_policy_loss_dppo_tv` / `compute_policy_loss_dppo_kl`): values, gradients and
clip fractions on random inputs, worked examples, and limits.

Registry-wide properties (masked rows, padding, sharding, vmap) run in
tests/registry_common_test.py; the hypothesis reference comparison for every loss in
tests/losses/policy_test.py.
"""
import math

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from credit import losses
from tests.losses.helpers import (B, T, make_batch, np_aggregate, np_dppo_token_loss, one_row,
                                  run)

jax.config.update("jax_numpy_rank_promotion", "raise")

NAMES = ("dppo_tv", "dppo_kl")


def _np_verl(name, b, **hp):
  """(loss [B,T], valid [B,T]) of verl's formula on batch `b` (float64)."""
  return np_dppo_token_loss(name[5:], b["logprob"], b["logprob_old"], b["advantages"],
                            b["response_mask"], **hp)


def _random_batch(seed, scale=1.0):
  """Token-level advantages of both signs; log-ratios wide enough to leave the region."""
  rng = np.random.default_rng(seed)
  b = make_batch(seed, delta_scale=scale)
  b["advantages"] = rng.normal(size=(B, T)).astype(np.float32)
  b["logprob"] = np.minimum(b["logprob"], -1e-3)  # probabilities below 1
  return b


# --------------------------------------------------------------------------
# Worked examples (from the code's logic).
# --------------------------------------------------------------------------


def test_tv_worked_example():
  # μ = 0.5 for both tokens; π = 0.7 (π − μ = 0.2 > δ = 0.15: out) and π = 0.6 (in).
  # A = 1: the kept token's gradient is −A·π/μ = −1.2, its value −A·1.2·log 0.6.
  b = one_row(np.log([0.7, 0.6]), np.log([0.5, 0.5]), 1.0)
  loss, metrics, g = run("dppo_tv", b, loss_agg_mode="token-sum")
  np.testing.assert_allclose(loss, -1.2 * math.log(0.6), rtol=1e-6)
  np.testing.assert_allclose(g["logprob"], [[0.0, -1.2]], rtol=1e-6)
  assert metrics["clipfrac"] == 0.5 and metrics["clipfrac_lower"] == 0.0
  # A = −1: only a fall of more than δ_low leaves the region; both rises stay in.
  b["advantages"] = -b["advantages"]
  _, metrics, g = run("dppo_tv", b, loss_agg_mode="token-sum")
  np.testing.assert_allclose(g["logprob"], [[1.4, 1.2]], rtol=1e-6)
  assert metrics["clipfrac"] == 0.0
  b = one_row(np.log([0.3, 0.4]), np.log([0.5, 0.5]), -1.0)   # falls of 0.2 and 0.1
  _, _, g = run("dppo_tv", b, loss_agg_mode="token-sum")
  np.testing.assert_allclose(g["logprob"], [[0.0, 0.8]], rtol=1e-6)


def test_kl_worked_example():
  # μ = 0.5 → π = 0.7: D = 0.5·log(0.5/0.7) + 0.5·log(0.5/0.3) = 0.0871767 > 0.05.
  d = float(losses.binary_kl(jnp.log(0.5), jnp.log(0.7)))
  np.testing.assert_allclose(d, 0.5 * math.log(5 / 7) + 0.5 * math.log(5 / 3), rtol=1e-5)
  # μ = 0.5 → π = 0.55: D = 0.5·log(0.5/0.55) + 0.5·log(0.5/0.45) = 0.0050125 ≤ 0.05.
  b = one_row(np.log([0.7, 0.55]), np.log([0.5, 0.5]), 1.0)
  loss, metrics, g = run("dppo_kl", b, loss_agg_mode="token-sum")
  np.testing.assert_allclose(g["logprob"], [[0.0, -1.1]], rtol=1e-6)
  np.testing.assert_allclose(loss, -1.1 * math.log(0.55), rtol=1e-6)
  assert metrics["clipfrac"] == 0.5
  # With A = −1 a rise is never masked (π ≥ μ), however large D is.
  b["advantages"] = -b["advantages"]
  _, metrics, g = run("dppo_kl", b, loss_agg_mode="token-sum")
  np.testing.assert_allclose(g["logprob"], [[1.4, 1.1]], rtol=1e-6)
  assert metrics["clipfrac"] == 0.0


def test_ratio_is_truncated_at_c():
  # π/μ = 0.6/0.01 = 60 > c = 20 (inside the TV region: π − μ = 0.59 ≤ δ = 1).
  b = one_row(np.log([0.6]), np.log([0.01]), 1.0)
  _, metrics, g = run("dppo_tv", b, {"clip_high": 1.0}, loss_agg_mode="token-sum")
  np.testing.assert_allclose(g["logprob"], [[-20.0]], rtol=1e-6)
  assert metrics["clipfrac_lower"] == 1.0 and metrics["clipfrac"] == 0.0
  _, _, g = run("dppo_tv", b, {"clip_high": 1.0, "clip_ratio_c": 1e4},
                loss_agg_mode="token-sum")
  np.testing.assert_allclose(g["logprob"], [[-60.0]], rtol=1e-5)


# --------------------------------------------------------------------------
# Random inputs against the transcription of verl.
# --------------------------------------------------------------------------


class VerlComparisonTest(parameterized.TestCase):

  @parameterized.product(name=NAMES, seed=(0, 1, 3),
                         mode=("token-mean", "seq-mean-token-sum-norm"))
  def test_matches_verl_values_gradients_and_clipfracs(self, name, seed, mode):
    b = _random_batch(seed)
    ref = _np_verl(name, b)
    assert ref is not None, "pick another seed: a token sits on a threshold"
    want_l, valid = ref
    m = b["response_mask"]
    loss, metrics, g = run(name, b, loss_agg_mode=mode, norm_constant=T)
    np.testing.assert_allclose(loss, np_aggregate(want_l, m, mode, C=T), rtol=1e-5, atol=1e-6)
    # ∂ℓ/∂log π = −A·min(ρ, c)·valid, then the aggregation's denominator.
    ratio = np.exp(np.clip(b["logprob"].astype(np.float64) - b["logprob_old"], -20, 20))
    dl = np.where(m, -b["advantages"] * np.minimum(ratio, 20.0) * valid, 0.0)
    denom = m.sum() if mode == "token-mean" else T
    np.testing.assert_allclose(g["logprob"], dl / denom, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["clipfrac"], 1.0 - valid[m].mean(), atol=1e-6)
    assert 0.0 < metrics["clipfrac"] < 1.0  # both branches are exercised

  @parameterized.parameters(*NAMES)
  def test_asymmetric_thresholds(self, name):
    b = _random_batch(5)
    hp = {"clip_low": 0.02, "clip_high": 0.3} if name == "dppo_tv" else {
        "clip_low": 0.01, "clip_high": 0.2}
    ref = _np_verl(name, b, **hp)
    assert ref is not None
    loss, _, _ = run(name, b, hp)
    np.testing.assert_allclose(loss, np_aggregate(ref[0], b["response_mask"], "token-mean"),
                               rtol=1e-5, atol=1e-6)


_wide = st.builds(
    lambda old, delta, adv: dict(logprob_old=old, logprob=(old + delta).astype(np.float32),
                                 advantages=adv, response_mask=np.ones((B, T), bool)),
    hnp.arrays(np.float32, (B, T), elements=st.floats(-8, 0, width=32)),
    hnp.arrays(np.float32, (B, T), elements=st.floats(-3, 3, width=32)),
    hnp.arrays(np.float32, (B, T), elements=st.floats(-2, 2, width=32)))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(b=_wide)
def test_matches_verl_on_hypothesis_inputs_including_positive_logprobs(name, b):
  # Log-probs above 0 (no distribution gives them) make verl's binary KL NaN: those
  # tokens compare as outside the region, and so they do here.
  ref = _np_verl(name, b)
  assume(ref is not None)
  loss, _, g = run(name, b)
  want = np_aggregate(ref[0], b["response_mask"], "token-mean")
  np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref[0]).max()))
  assert np.all(np.isfinite(g["logprob"]))


# --------------------------------------------------------------------------
# Limits and jit.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_huge_region_and_cap_is_the_is_weighted_policy_gradient(name):
  # δ, c → ∞: every token is kept; the gradient is PPO's unclipped −Aρ∇log π.
  b = _random_batch(7)
  wide = {"clip_low": 1e6, "clip_high": 1e6, "clip_ratio_c": 1e9}
  _, metrics, g = run(name, b, wide)
  _, _, want = run("ppo_clip", b, {"clip_low": 1e6, "clip_high": 1e6}, clip_ratio_c=None)
  np.testing.assert_allclose(g["logprob"], want["logprob"], rtol=1e-5, atol=1e-7)
  assert metrics["clipfrac"] == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_moves_against_the_advantage_are_never_masked(name):
  # A > 0 with π falling, A < 0 with π rising: always inside the region.
  b = _random_batch(8, scale=2.0)
  against = np.sign(b["advantages"]) * (b["logprob"] - b["logprob_old"]) < 0
  _, _, g = run(name, b, loss_agg_mode="token-sum")
  m = b["response_mask"] & against
  ratio = np.exp(b["logprob"].astype(np.float64) - b["logprob_old"])
  np.testing.assert_allclose(g["logprob"][m], (-b["advantages"] * np.minimum(ratio, 20.0))[m],
                             rtol=1e-5)


def test_bad_threshold_is_refused():
  b = one_row([-1.0], [-1.0], 1.0)
  with pytest.raises(ValueError, match="clip_high"):
    losses.dppo_tv_loss(**b, clip_high=0.0)
  with pytest.raises(ValueError, match="clip_ratio_c"):
    losses.dppo_kl_loss(**b, clip_ratio_c=-1.0)


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager(self):
    b = _random_batch(3)
    for fn in (losses.dppo_tv_loss, losses.dppo_kl_loss):
      out = self.variant(lambda **kw: fn(**kw).loss)(**b)
      ref = fn(**b).loss
      np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)
