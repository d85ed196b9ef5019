"""Decoupled PPO (credit/losses/policy/decoupled_ppo.py): the worked example, the
reduction to PPO clip on-policy, the behaviour-weight cap (mask / truncate) and its
denominators, stop-gradients and argument checks.

Registry-wide properties (jit == eager, sharded, masked rows == sliced rows, padding,
degenerate inputs, vmap over a hyperparameter) live in tests/registry_common_test.py.
"""
import inspect

import numpy as np
import pytest

from credit import get_policy_loss, losses
from tests.losses.helpers import B, T, make_batch, np_token_loss, one_row, run

PPO_04 = {"clip_low": 0.4, "clip_high": 0.4}   # ASearcher's eps_clip, no dual clip


def _capped_batch(seed=2):
  """make_batch plus sampler log-probs with w = π_old/π_sampler in {1.5, 0.8, 6, 40}: the
  last two above the cap 5; row 3 is rejected entirely."""
  b = make_batch(seed)
  w = np.array([1.5, 0.8, 6.0, 1.5, 40.0, 0.8], np.float32)[np.arange(B * T) % 6].reshape(B, T)
  w[3] = 7.0
  b["logprob_sampler"] = (b["logprob_old"] - np.log(w)).astype(np.float32)
  w = np.exp(b["logprob_old"].astype(np.float64) - b["logprob_sampler"])
  return b, w


def _np_ppo(b):
  return np_token_loss("ppo_clip", b["logprob"], b["logprob_old"], b["advantages"],
                       b["response_mask"], clip_ratio_c=None, **PPO_04)


def test_spec_worked_example():
  # C1: ℓθ = ℓprox = −1, ℓbehav = −1.2, A = 1 → ρ = 1, w = e^{0.2}, L = −w·A·ρ = −1.221403;
  # dL/dℓθ = −w·A·ρ = −1.221403 (unclipped); nothing flows into ℓprox, ℓbehav or A.
  b = dict(one_row(-1.0, -1.0, 1.0), logprob_sampler=np.full((1, 1), -1.2, np.float32))
  loss, metrics, g = run("decoupled_ppo", b)
  np.testing.assert_allclose(loss, -1.221403, atol=1e-6)
  np.testing.assert_allclose(metrics["is_weight_mean"], 1.221403, atol=1e-6)
  assert metrics["is_frac_high"] == 0.0 and metrics["clipfrac"] == 0.0
  np.testing.assert_allclose(g["logprob"], [[-1.221403]], atol=1e-6)
  for k in ("logprob_old", "logprob_sampler", "advantages"):
    np.testing.assert_array_equal(g[k], 0.0, err_msg=k)


def test_defaults_are_asearchers():
  spec = get_policy_loss("decoupled_ppo")
  assert spec.needs == {"logprob", "logprob_old", "advantages", "response_mask",
                        "logprob_sampler"}
  assert spec.token_fn is losses.decoupled_ppo_loss and spec.confidence == "code-verified"
  p = inspect.signature(spec.fn).parameters
  assert (p["clip_low"].default, p["clip_high"].default, p["clip_ratio_c"].default) == (
      0.4, 0.4, None)
  assert (p["is_mode"].default, p["is_threshold"].default, p["is_level"].default) == (
      "mask", 5.0, "token")


def test_equals_ppo_clip_when_the_sampler_is_the_proximal_policy():
  b = make_batch(1)
  b["logprob_sampler"] = b["logprob_old"].copy()
  loss, metrics, g = run("decoupled_ppo", b)
  want, _, g_want = run("ppo_clip", {k: v for k, v in b.items() if k != "logprob_sampler"},
                        PPO_04, clip_ratio_c=None)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  np.testing.assert_allclose(g["logprob"], g_want["logprob"], rtol=1e-6, atol=1e-7)
  assert metrics["is_frac_high"] == 0.0 and metrics["is_weight_mean"] == 1.0
  np.testing.assert_allclose(loss, np.sum(_np_ppo(b)) / b["response_mask"].sum(), rtol=1e-5)


def test_cap_drops_the_tokens_above_it_and_keeps_them_in_the_denominator():
  b, w = _capped_batch()
  m = b["response_mask"]
  ppo = _np_ppo(b)
  keep = m & (w <= 5.0)
  loss, metrics, g = run("decoupled_ppo", b)
  # AReaL: Σ_M 1[w ≤ C]·w·ℓ / Σ M (the count before rejection).
  np.testing.assert_allclose(loss, np.sum(np.where(keep, w * ppo, 0.0)) / m.sum(), rtol=1e-5)
  capped = (m & (w > 5.0)).sum() / m.sum()
  np.testing.assert_allclose(metrics["is_frac_high"], capped, rtol=1e-6)
  np.testing.assert_allclose(metrics["is_frac_rejected"], capped, rtol=1e-6)
  np.testing.assert_allclose(metrics["is_weight_mean"],
                             np.sum(np.where(keep, w, 0.0)) / m.sum(), rtol=1e-5)
  assert "clipfrac" in metrics and metrics["clipfrac"] > 0.0
  # Dropped tokens get no gradient; kept ones do; data inputs never do.
  assert np.all(g["logprob"][m & ~keep] == 0.0) and np.any(g["logprob"][keep] != 0.0)
  for k in ("logprob_old", "logprob_sampler", "advantages"):
    np.testing.assert_array_equal(g[k], 0.0, err_msg=k)
  # Global counts are used as given (micro-batches of one step share them).
  got, _, _ = run("decoupled_ppo", b, {"num_tokens_global": np.float32(100.0)})
  np.testing.assert_allclose(got, np.sum(np.where(keep, w * ppo, 0.0)) / 100.0, rtol=1e-5)
  # seq-mean-token-sum: a fully rejected row (row 3) still counts as a row.
  got, _, _ = run("decoupled_ppo", b, loss_agg_mode="seq-mean-token-sum")
  rows = m.any(1).sum()
  np.testing.assert_allclose(got, np.sum(np.where(keep, w * ppo, 0.0)) / rows, rtol=1e-5)


def test_truncate_mode_clamps_the_weight():
  b, w = _capped_batch()
  m = b["response_mask"]
  loss, metrics, _ = run("decoupled_ppo", b, is_mode="truncate")
  want = np.sum(np.where(m, np.minimum(w, 5.0) * _np_ppo(b), 0.0)) / m.sum()
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  assert "is_frac_rejected" not in metrics and metrics["is_frac_high"] > 0.0


def test_extreme_log_ratios_stay_finite():
  b = make_batch(5)
  b["logprob_sampler"] = b["logprob_old"].copy()
  b["logprob"][0, 0], b["logprob_old"][0, 0] = -0.01, -80.0   # ρ = e^80 → clamped at e^20
  b["logprob_sampler"][0, 1] = b["logprob_old"][0, 1] - 90.0  # w = e^90 → rejected
  b["logprob_sampler"][0, 2] = b["logprob_old"][0, 2] + 90.0  # w = e^-90
  for mode in ("mask", "truncate"):
    loss, metrics, g = run("decoupled_ppo", b, is_mode=mode)
    assert np.isfinite(loss) and all(np.isfinite(v) for v in metrics.values())
    assert all(np.all(np.isfinite(v)) for v in g.values())


@pytest.mark.parametrize("kw,match", [
    ({"is_threshold": 1.0}, "is_threshold"), ({"is_threshold": 0.5}, "is_threshold"),
    ({"clip_low": -0.1}, "clip_low"), ({"clip_high": -0.2}, "clip_high"),
    ({"clip_low": 1.0}, "clip_low"), ({"clip_ratio_c": 0.9}, "clip_ratio_c")])
def test_bad_hyperparameters_raise(kw, match):
  b = dict(one_row(-1.0, -1.0, 1.0), logprob_sampler=np.full((1, 1), -1.2, np.float32))
  with pytest.raises(ValueError, match=match):
    get_policy_loss("decoupled_ppo").fn(**b, **kw)
