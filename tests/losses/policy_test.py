"""Tests of the policy losses in credit.losses.policy: worked examples, numpy references,
limits, micro-batch sums, stop-gradients and degenerate inputs.

Registry-wide properties (jit == eager, sharded == unsharded, masked rows == sliced rows,
finite gradients with garbage under the mask, vmap over a hyperparameter) live in
tests/registry_common_test.py.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import assume, given

from credit import losses
from tests.losses.helpers import (B, DISTILL, EXPECTED, NAMES, ROW_LOCAL, T, batches,
                                  default_mode, fn_of, make_batch, np_aggregate, np_token_loss,
                                  one_row, run, with_needs)

# --------------------------------------------------------------------------
# Worked examples.
# --------------------------------------------------------------------------


def test_grpo_ppo_clip_example():
  # §1: A=0.866024, logp_old=-1, logp_new=-0.7 -> ratio 1.349859 clipped at 1.2.
  loss, metrics, g = run("ppo_clip", one_row(-0.7, -1.0, 0.866024),
                         {"clip_low": 0.2, "clip_high": 0.2})
  np.testing.assert_allclose(loss, -1.039229, atol=1e-5)
  np.testing.assert_allclose(metrics["ratio_mean"], 1.349859, atol=1e-5)
  assert metrics["clipfrac"] == 1.0 and g["logprob"][0, 0] == 0.0
  np.testing.assert_allclose(metrics["approx_kl"], -0.3, atol=1e-6)


def test_dapo_clip_higher_example():
  # §7: ratio 1.25 with A>0 is unclipped at ε_high=0.28, clipped at 1.2 under GRPO.
  b = one_row(math.log(1.25), 0.0, 1.0)
  loss, _, g = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": 0.28})
  np.testing.assert_allclose(loss, -1.25, atol=1e-5)
  np.testing.assert_allclose(g["logprob"], [[-1.25]], atol=1e-5)
  loss, _, g = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": 0.2})
  np.testing.assert_allclose(loss, -1.2, atol=1e-5)
  np.testing.assert_allclose(g["logprob"], [[0.0]])


def test_dcpo_bounds_table():
  # §8: q=0.9 -> [0.768742, 1.187184]; q=0.5 -> [0.5, 1.306226]; q=0.01 -> [0.5, 5.0].
  low, high = losses.dcpo_clip_bounds(jnp.log(jnp.array([0.9, 0.5, 0.01])))
  np.testing.assert_allclose(low, [0.768742, 0.5, 0.5], atol=1e-5)
  np.testing.assert_allclose(high, [1.187184, 1.306226, 5.0], atol=1e-5)
  # q -> 0: r_high hits the cap and r_low the continuous limit 1/2, also at q = 0 exactly.
  low, high = losses.dcpo_clip_bounds(jnp.array([-200.0, -jnp.inf]), cap=10.0)
  np.testing.assert_allclose(low, [0.5, 0.5])
  np.testing.assert_allclose(high, [10.0, 10.0])


def test_dcpo_q_to_one_reduces_to_ppo_with_the_limit_bounds():
  # q = 1: r_low = 1/2 + sqrt(1 - 4·0.16)/2 = 0.8, r_high = 1/2 + sqrt(1 + 4·0.2)/2.
  b = make_batch(3)
  b["logprob_old"] = np.zeros_like(b["logprob_old"])
  r_high = 0.5 + 0.5 * math.sqrt(1.8)
  low, high = losses.dcpo_clip_bounds(jnp.zeros(()))
  np.testing.assert_allclose([low, high], [0.8, r_high], atol=1e-6)
  got, _, g_got = run("dcpo", b)
  want, _, g_want = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": r_high - 1,
                                        "clip_ratio_c": 10.0})
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_got["logprob"], g_want["logprob"], rtol=1e-5, atol=1e-7)


def test_gspo_examples():
  # §6: log-ratios [0.02, 0.04] -> s = 1.030455 > 1.0004, value -1.0004, zero gradient.
  b = one_row(np.array([-1.0, -2.0, 0.0]) + [0.02, 0.04, 0.0], [-1.0, -2.0, 0.0], 1.0,
              [[True, True, False]])
  loss, metrics, g = run("gspo", b)
  np.testing.assert_allclose(loss, -1.0004, atol=1e-6)
  np.testing.assert_allclose(metrics["seq_ratio_mean"], 1.030455, atol=1e-5)
  np.testing.assert_array_equal(g["logprob"], np.zeros((1, 3)))
  # [0.1, -0.3, 0.2] -> s = 1, unclipped: the gradient is -A·s/|o| on every token.
  b = one_row(np.array([-1.0, -1.5, -0.5]) + [0.1, -0.3, 0.2], [-1.0, -1.5, -0.5], 1.0)
  loss, _, g = run("gspo", b)
  np.testing.assert_allclose(loss, -1.0, atol=1e-6)
  np.testing.assert_allclose(g["logprob"], np.full((1, 3), -1 / 3), atol=1e-6)


def test_gspo_single_token_rows_equal_ppo_without_dual_clip():
  b = make_batch(4, Tn=1)
  b["response_mask"] = np.ones_like(b["response_mask"])
  eps = {"clip_low": 0.2, "clip_high": 0.2}
  got, _, g_got = run("gspo", b, eps)
  want, _, g_want = run("ppo_clip", b, eps, clip_ratio_c=None,
                        loss_agg_mode="seq-mean-token-mean")
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(g_got["logprob"], g_want["logprob"], rtol=1e-5, atol=1e-7)


def test_luspo_is_gspo_with_token_sum_per_sequence():
  b = make_batch(5, delta_scale=1e-4)
  got, _, g_got = run("luspo", b)
  want, _, g_want = run("gspo", b, loss_agg_mode="seq-mean-token-sum")
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(g_got["logprob"], g_want["logprob"], rtol=1e-5, atol=1e-7)
  assert np.any(g_got["logprob"] != 0)


def test_gmpo_clips_in_log_space_and_averages_geometrically():
  # One row, A=1, token log-ratios [1.0, -0.2]: the first is clipped to 0.4 (A>0 upper
  # bound), so r = exp((0.4 - 0.2)/2) and the loss is -r.
  loss, metrics, g = run("gmpo", one_row([0.0, -0.2], [-1.0, 0.0], 1.0))
  np.testing.assert_allclose(loss, -math.exp(0.1), rtol=1e-6)
  assert metrics["clipfrac"] == 0.5
  np.testing.assert_allclose(g["logprob"], [[0.0, -math.exp(0.1) / 2]], rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------
# Every loss: numpy reference, stop-gradients, degenerate inputs.
# --------------------------------------------------------------------------


class PolicyLossTest(parameterized.TestCase):

  @parameterized.named_parameters((n, n) for n in NAMES)
  @given(b=batches)
  def test_matches_numpy_reference(self, name, b):
    want_l = np_token_loss(name, b["logprob"], b["logprob_old"], b["advantages"],
                           b["response_mask"], extra=with_needs(name, b))
    assume(want_l is not None)
    want = np_aggregate(want_l, b["response_mask"], default_mode(name))
    loss, metrics, g = run(name, b)
    scale = max(1.0, float(np.abs(want_l).max()))
    np.testing.assert_allclose(loss, want, rtol=1e-4, atol=2e-5 * scale)
    assert {"approx_kl", "ratio_mean", "ratio_max", "ratio_min"} <= set(metrics)
    assert all(np.isfinite(v) for v in metrics.values())
    assert np.all(np.isfinite(g["logprob"]))

  @parameterized.named_parameters((n, n) for n in NAMES)
  def test_degenerate_inputs_are_finite(self, name):
    b = make_batch(8)
    m = b["response_mask"].copy()
    m[1:3] = False  # fully masked rows
    alt = np.where(np.arange(T) % 2 == 0, 50.0, -50.0).astype(np.float32)
    cases = [
        {**b, "response_mask": m},
        {**b, "advantages": np.zeros_like(b["advantages"])},
        {**b, "logprob": b["logprob_old"] + 50.0},
        {**b, "logprob": b["logprob_old"] - 50.0},
        {**b, "logprob": b["logprob_old"] + alt},
        {**b, "logprob_old": b["logprob"] + alt},
        {**b, "response_mask": np.zeros_like(m)},
    ]
    for c in cases:
      loss, metrics, g = run(name, c)
      assert np.isfinite(loss), (name, loss)
      assert all(np.all(np.isfinite(v)) for v in g.values()), name
      assert all(np.isfinite(v) for v in metrics.values()), metrics
    loss, _, g = run(name, cases[1])
    # δ² / |δ| penalties and distillation divergences do not vanish with A = 0.
    if name not in ("dro", "kl_cov") + DISTILL:
      assert loss == 0.0 and np.all(g["logprob"] == 0.0)
    loss, metrics, g = run(name, cases[-1])
    assert loss == 0.0 and np.all(g["logprob"] == 0.0)
    assert metrics["ratio_max"] == 0.0 and metrics["approx_kl"] == 0.0

  @parameterized.named_parameters((n, n) for n in NAMES)
  def test_gradient_only_through_logprob(self, name):
    b = make_batch(10)
    _, _, g = run(name, b)
    np.testing.assert_array_equal(g["logprob_old"], 0.0)
    np.testing.assert_array_equal(g["advantages"], 0.0)
    assert np.any(g["logprob"] != 0)
    if name in DISTILL:  # the student's buckets carry gradient; the teacher is a target
      assert np.any(g["logprob_topk"] != 0)
      np.testing.assert_array_equal(g["teacher_topk_logprob"], 0.0)
    smp = {**b, "logprob_sampler": b["logprob_old"] + 0.05}
    _, _, g = run(name, smp)
    for k in ("logprob_old", "advantages", "logprob_sampler", "teacher_topk_logprob"):
      np.testing.assert_array_equal(g.get(k, 0.0), 0.0, err_msg=k)


# --------------------------------------------------------------------------
# Micro-batches with global counts sum to the full batch (row-local losses only: the
# batch-coupled clip_cov / kl_cov select tokens per micro-batch, as verl does).
# --------------------------------------------------------------------------

# Every aggregation mode is exercised by at least one loss; ppo_clip runs all of them.
_MICRO_CASES = [(n, losses.AGG_MODES[i % len(losses.AGG_MODES)])
                for i, n in enumerate(ROW_LOCAL)]
_MICRO_CASES += [("ppo_clip", mode) for mode in losses.AGG_MODES
                 if ("ppo_clip", mode) not in _MICRO_CASES]


@functools.lru_cache(maxsize=None)
def _micro_program(name, mode):
  fn = fn_of(name)

  def loss(lp, b, **kw):
    return fn(**{**b, "logprob": lp}, loss_agg_mode=mode, norm_constant=10.0, **kw).loss

  @jax.jit
  def run_both(b):
    full, g_full = jax.value_and_grad(loss)(b["logprob"], b)
    m = b["response_mask"]
    kw = dict(num_tokens_global=jnp.sum(m), num_seqs_global=jnp.sum(jnp.any(m, axis=1)))
    parts = [jax.value_and_grad(loss)(b["logprob"][i:i + 2], jax.tree.map(
        lambda v, i=i: v[i:i + 2], b), **kw) for i in range(0, B, 2)]
    return full, g_full, sum(p[0] for p in parts), jnp.concatenate([p[1] for p in parts])

  return run_both


@pytest.mark.parametrize("name,mode", _MICRO_CASES)
def test_microbatches_sum_to_full_batch(name, mode):
  full, g_full, micro, g_micro = _micro_program(name, mode)(with_needs(name, make_batch(9)))
  np.testing.assert_allclose(micro, full, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_micro, g_full, rtol=1e-5, atol=1e-6)
  assert np.any(g_full != 0)


def test_micro_cases_cover_every_mode_and_loss():
  assert {m for _, m in _MICRO_CASES} == set(losses.AGG_MODES)
  assert {n for n, _ in _MICRO_CASES} == set(ROW_LOCAL)
  assert set(NAMES) - set(ROW_LOCAL) == {"clip_cov", "kl_cov", "m2po", "slate_step"}


# --------------------------------------------------------------------------
# Reductions to simpler losses at limiting hyperparameters.
# --------------------------------------------------------------------------

_WIDE = {"clip_low": 1e6, "clip_high": 1e6}


def test_ppo_with_huge_eps_is_reinforce_with_ratio():
  b = make_batch(12)
  m, a = b["response_mask"], b["advantages"]
  r = np.exp(b["logprob"] - b["logprob_old"])
  loss, metrics, g = run("ppo_clip", b, _WIDE, clip_ratio_c=None)
  np.testing.assert_allclose(loss, (-a * r)[m].mean(), rtol=1e-5)
  np.testing.assert_allclose(g["logprob"], np.where(m, -a * r, 0) / m.sum(), rtol=1e-5,
                             atol=1e-7)
  assert metrics["clipfrac"] == 0


def test_dual_clip_caps_negative_advantage_loss():
  b = one_row([math.log(5.0)] * 2, [0.0, 0.0], 1.0)
  b["advantages"] = np.array([[-1.0, 1.0]], np.float32)
  loss, metrics, _ = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": 0.2},
                         loss_agg_mode="token-sum")
  np.testing.assert_allclose(loss, 3.0 - 1.2, atol=1e-5)  # min(5, c=3)·|A| and -1.2
  assert metrics["clipfrac_lower"] == 0.5
  with pytest.raises(ValueError, match="clip_ratio_c"):
    losses.ppo_clip_loss(**b, clip_ratio_c=0.5)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_on_policy_gradient_is_reinforce(name):
  # At ratio 1 (log π = log π_old) every loss's gradient is the REINFORCE gradient
  # −A∇log π (GPG) under the loss's aggregation; LUSPO's |o| scaling turns the
  # per-sequence token mean into a token sum.
  b = make_batch(13)
  b["logprob"] = b["logprob_old"].copy()
  mode = default_mode(name) if name != "luspo" else "seq-mean-token-sum"
  hp = {"clip_cov_lb": 1e9, "clip_cov_ub": 2e9} if name == "clip_cov" else None
  _, _, ref = run("gpg", b, loss_agg_mode=mode)
  _, _, got = run(name, b, hp)
  np.testing.assert_allclose(got["logprob"], ref["logprob"], rtol=1e-5, atol=1e-7)


def test_sapo_small_temperature_is_unclipped_ppo_gradient():
  b = make_batch(12, delta_scale=0.3)
  _, _, got = run("sapo", b, {"tau_pos": 1e-3, "tau_neg": 1e-3}, loss_agg_mode="token-mean")
  _, _, want = run("ppo_clip", b, _WIDE, clip_ratio_c=None)
  np.testing.assert_allclose(got["logprob"], want["logprob"], rtol=1e-3, atol=1e-6)


def test_dro_beta_zero_is_gpg_and_cispo_wide_clip_is_weighted_pg():
  b = make_batch(12)
  got, _, g_got = run("dro", b, {"beta": 0.0})
  want, _, g_want = run("gpg", b)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(g_got["logprob"], g_want["logprob"], rtol=1e-6)
  m, a = b["response_mask"], b["advantages"]
  r = np.exp(b["logprob"] - b["logprob_old"])
  _, _, g = run("cispo", b, {"clip_low": 1.0, "clip_high": 1e6})
  np.testing.assert_allclose(g["logprob"], np.where(m, -a * r, 0) / m.sum(), rtol=1e-5,
                             atol=1e-7)


def test_vespo_kernel_is_one_on_policy_and_decays_off_policy():
  b = make_batch(12)
  _, metrics, _ = run("vespo", {**b, "logprob": b["logprob_old"]})
  np.testing.assert_allclose(metrics["phi_mean"], 1.0, rtol=1e-6)
  _, metrics, _ = run("vespo", {**b, "logprob": b["logprob_old"] + 3.0})
  assert metrics["phi_max"] < 1e-3


def test_clip_cov_and_kl_cov_select_the_documented_tokens():
  b = make_batch(17, Bn=64, Tn=64, delta_scale=0.05)
  n = b["response_mask"].sum()
  k = max(int(2e-4 * n), 1)
  _, metrics, _ = run("kl_cov", b)
  np.testing.assert_allclose(metrics["kl_selected_frac"], k / n, rtol=1e-6)
  nothing, metrics, _ = run("clip_cov", b, {"clip_cov_lb": 1e9, "clip_cov_ub": 2e9})
  ppo, _, _ = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": 0.2}, clip_ratio_c=None)
  np.testing.assert_allclose(nothing, ppo, rtol=1e-6)
  assert metrics["cov_selected_frac"] == 0
  # Random selection: each key picks k = ⌊0.05·N⌋ candidates; different keys differ.
  wide = {"clip_cov_lb": -1e9, "clip_cov_ub": 1e9}
  picks = [run("clip_cov", b, {**wide, "key": jax.random.key(s)}, clip_cov_ratio=0.05)
           for s in range(3)]
  for _, metrics, _ in picks:
    np.testing.assert_allclose(metrics["cov_selected_frac"] * n, int(0.05 * n), atol=0.5)
  assert len({float(p[0]) for p in picks}) > 1
  zero_coef, _, _ = run("kl_cov", b, {"ppo_kl_coef": 0.0})
  unclipped, _, _ = run("ppo_clip", b, _WIDE, clip_ratio_c=None)
  np.testing.assert_allclose(zero_coef, unclipped, rtol=1e-6)
