"""Tests of credit.losses: aggregation, every registered policy loss, TIS/MIS, entropy, value.

Every policy loss in the registry is checked against a float64 numpy loop reference on
hypothesis batches of one fixed shape, for jit == eager, mask == slice and padding
invariance, finite values and gradients on degenerate inputs, micro-batch sums == the
full batch in every aggregation mode, stop-gradients, and a sharded call on 8 devices.
"""
import functools
import math

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import assume, given, strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from credit import losses
from credit.registry import get_policy_loss, list_policy_losses

B, T = 8, 6
NAMES = [n for n in list_policy_losses() if get_policy_loss(n).fn.__module__ == losses.__name__]
ROW_LOCAL = [n for n in NAMES if n not in losses.BATCH_COUPLED_LOSSES]
EXPECTED = {"ppo_clip", "dcpo", "gspo", "cispo", "sapo", "gmpo", "gpg", "clip_cov", "kl_cov",
            "dro", "luspo", "vespo"}


def fn_of(name):
  return get_policy_loss(name).fn


# --------------------------------------------------------------------------
# numpy float64 references (explicit loops).
# --------------------------------------------------------------------------


def np_aggregate(l, m, mode, C=None, nt=None, ns=None):
  l = np.where(m, l, 0.0).astype(np.float64)
  lens = m.sum(1)
  rows = max((lens > 0).sum(), 1) if ns is None else ns
  ntok = max(m.sum(), 1) if nt is None else nt
  if mode == "token-mean":
    return l.sum() / ntok
  if mode == "seq-mean-token-mean":
    return sum(l[i].sum() / max(lens[i], 1) for i in range(len(l))) / rows
  if mode == "seq-mean-token-sum":
    return l.sum() / rows
  if mode == "seq-mean-token-sum-norm":
    return l.sum() / C
  if mode == "seq-mean-token-sum-norm-batch":
    return l.sum() / (rows * C)
  if mode == "token-sum":
    return l.sum()
  raise ValueError(mode)


def _np_cov(lp, adv, m):
  a_mean = adv[m].mean() if m.any() else 0.0
  l_mean = lp[m].mean() if m.any() else 0.0
  return (adv - a_mean) * (lp - l_mean)


def np_token_loss(name, lp, old, adv, m, **hp):
  """Per-token loss [B,T] (float64) of every registered loss, written as plain loops."""
  lp, old, adv = (np.where(m, a, 0.0).astype(np.float64) for a in (lp, old, adv))
  Bn, Tn = lp.shape
  d = np.clip(lp - old, -20, 20)
  r = np.exp(d)
  out = np.zeros((Bn, Tn))
  lens = m.sum(1)
  if name in ("ppo_clip", "dcpo", "clip_cov"):
    eps_l, eps_h = hp.get("clip_low", 0.16 if name == "dcpo" else 0.2), hp.get(
        "clip_high", 0.2)
    c = hp.get("clip_ratio_c", {"ppo_clip": 3.0, "dcpo": 10.0, "clip_cov": None}[name])
    for i in range(Bn):
      for t in range(Tn):
        if name == "dcpo":
          q = max(math.exp(old[i, t]), 1e-30)
          lo = 0.5 + 0.5 * math.sqrt(max(1 - 4 * eps_l / q, 0.0))
          hi = min(0.5 + 0.5 * math.sqrt(1 + 4 * eps_h / q), max(c, 10.0))
        else:
          lo, hi = 1 - eps_l, 1 + eps_h
        a = adv[i, t]
        lc = max(-a * r[i, t], -a * min(max(r[i, t], lo), hi))
        out[i, t] = min(lc, -a * c) if (c is not None and a < 0) else lc
    if name == "clip_cov":
      clipped = np.zeros((Bn, Tn), bool)
      for i in range(Bn):
        for t in range(Tn):
          a = adv[i, t]
          clipped[i, t] = -a * min(max(r[i, t], 0.8), 1.2) > -a * r[i, t]
      cov = _np_cov(lp, adv, m)
      near = (np.abs(cov - 1.0) < 1e-3) | (np.abs(cov - 5.0) < 1e-3) | (
          np.abs(r - 0.8) < 1e-4) | (np.abs(r - 1.2) < 1e-4)
      if np.any(near & m):
        return None  # candidate status is decided by float32 rounding
      cand = m & ~clipped & (cov > 1.0) & (cov < 5.0)
      k = max(int(math.floor(2e-4 * m.sum())), 1)
      order = sorted(zip(*np.nonzero(cand)), key=lambda it: -cov[it])
      if len(order) > k and abs(cov[order[k - 1]] - cov[order[k]]) < 1e-3:
        return None
      for it in order[:k]:
        out[it] = 0.0
    return out
  if name == "kl_cov":
    cov = _np_cov(lp, adv, m)
    k = max(int(math.floor(2e-4 * m.sum())), 1)
    order = sorted(zip(*np.nonzero(m)), key=lambda it: -cov[it])
    if len(order) > k and abs(cov[order[k - 1]] - cov[order[k]]) < 1e-3:
      return None
    out = -adv * r
    for it in order[:k]:
      out[it] += abs(d[it])
    return out
  if name in ("gspo", "luspo"):
    for i in range(Bn):
      log_s = sum(d[i, t] for t in range(Tn) if m[i, t]) / max(lens[i], 1)
      s = math.exp(min(log_s, 10.0))
      for t in range(Tn):
        a = adv[i, t]
        out[i, t] = max(-a * s, -a * min(max(s, 1 - 3e-4), 1 + 4e-4))
        if name == "luspo":
          out[i, t] *= lens[i]
    return out
  if name == "gmpo":
    for i in range(Bn):
      acc, a_sum = 0.0, 0.0
      for t in range(Tn):
        if not m[i, t]:
          continue
        a = adv[i, t]
        dc = min(max(d[i, t], -0.4), 0.4)
        if a > 0:
          acc += min(d[i, t], dc)
        elif a < 0:
          acc += max(d[i, t], dc)
        a_sum += a
      n = max(lens[i], 1)
      out[i, :] = -(a_sum / n) * math.exp(acc / n)
    return out
  if name == "vespo":
    for i in range(Bn):
      log_w = min(max(sum(d[i, t] for t in range(Tn) if m[i, t]), -20), 20)
      pos = sum(adv[i, t] for t in range(Tn) if m[i, t]) / max(lens[i], 1) >= 0
      k, lam = (2.0, 3.0) if pos else (3.0, 2.0)
      phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
      for t in range(Tn):
        out[i, t] = -phi * adv[i, t] * lp[i, t]
    return out
  for i in range(Bn):
    for t in range(Tn):
      a, x = adv[i, t], lp[i, t]
      if name == "cispo":
        out[i, t] = -min(max(r[i, t], 0.0), 1.28) * a * x
      elif name == "gpg":
        out[i, t] = -a * x
      elif name == "dro":
        out[i, t] = -(a * x - 0.5 * d[i, t] ** 2)
      elif name == "sapo":
        tau = 1.0 if a > 0 else 1.05
        out[i, t] = -4.0 / tau / (1 + math.exp(-tau * (r[i, t] - 1))) * a
      else:
        raise KeyError(name)
  return out


DEFAULT_MODE = {n: fn_of(n).__kwdefaults__["loss_agg_mode"] for n in NAMES}


# --------------------------------------------------------------------------
# Inputs and cached jitted programs (one compile per loss, shape and static config).
# --------------------------------------------------------------------------


def make_batch(seed=0, Bn=B, Tn=T, delta_scale=0.5):
  rng = np.random.default_rng(seed)
  old = -np.abs(rng.normal(size=(Bn, Tn))).astype(np.float32) - 0.05
  lp = (old + delta_scale * rng.normal(size=(Bn, Tn))).astype(np.float32)
  adv = np.repeat(rng.normal(size=(Bn, 1)), Tn, 1).astype(np.float32)
  lens = rng.integers(0, Tn + 1, size=Bn)
  lens[0] = Tn
  m = np.arange(Tn)[None, :] < lens[:, None]
  return dict(logprob=lp, logprob_old=old, advantages=adv, response_mask=m)


_DIFF = ("logprob", "logprob_old", "advantages")


@functools.lru_cache(maxsize=None)
def program(name, **static):
  """jit(value_and_grad) of a loss w.r.t. (logprob, logprob_old, advantages[, sampler]).

  Called as program(name, **static)(batch, hp) with `hp` a dict of traced hyperparameters;
  returns ((loss, metrics), grads dict).
  """
  fn = fn_of(name)

  def f(diff, rest, hp):
    return tuple(fn(**diff, **rest, **hp, **static))

  vg = jax.value_and_grad(f, has_aux=True)

  @jax.jit
  def run(batch, hp):
    diff = {k: batch[k] for k in batch if k in _DIFF or k == "logprob_sampler"}
    rest = {k: batch[k] for k in batch if k not in diff}
    return vg(diff, rest, hp)

  return lambda batch, hp=None: run(batch, hp or {})


def run(name, batch, hp=None, **static):
  (loss, metrics), grads = program(name, **static)(batch, hp)
  return loss, metrics, grads


batches = st.builds(
    lambda old, delta, adv_row, lens: dict(
        logprob_old=old, logprob=(old + delta).astype(np.float32),
        advantages=np.repeat(adv_row[:, None], T, 1), response_mask=np.arange(T)[None, :]
        < lens[:, None]),
    hnp.arrays(np.float32, (B, T), elements=st.floats(-6, -0.015625, width=32)),
    hnp.arrays(np.float32, (B, T), elements=st.floats(-1.5, 1.5, width=32)),
    hnp.arrays(np.float32, (B,), elements=st.floats(-2, 2, width=32)),
    hnp.arrays(np.int64, (B,), elements=st.integers(0, T)))


# --------------------------------------------------------------------------
# Registry and aggregation.
# --------------------------------------------------------------------------


def test_registry_has_every_loss_with_contract_needs():
  assert EXPECTED <= set(NAMES)
  for n in NAMES:
    spec = get_policy_loss(n)
    assert spec.needs == {"logprob", "logprob_old", "advantages", "response_mask"}
    assert "arXiv" in spec.paper
    assert {"loss_agg_mode", "is_level", "is_mode"} <= set(spec.static_argnames)
    assert "Args:" in spec.fn.__doc__ and "@common_args@" not in spec.fn.__doc__


def test_unknown_names_raise_listing_the_known_ones():
  with pytest.raises(ValueError, match="known: .*seq-mean-token-mean.*token-sum"):
    losses.aggregate_loss(jnp.ones((2, 3)), jnp.ones((2, 3), bool), "mean")
  with pytest.raises(ValueError, match="loss_agg_mode"):
    losses.ppo_clip(**make_batch(), loss_agg_mode="sum")
  with pytest.raises(ValueError, match="norm_constant"):
    losses.aggregate_loss(jnp.ones((2, 3)), jnp.ones((2, 3), bool), "seq-mean-token-sum-norm")
  with pytest.raises(ValueError, match="importance level"):
    losses.ppo_clip(**make_batch(), logprob_sampler=make_batch()["logprob_old"],
                    is_level="tok")
  with pytest.raises(ValueError, match="importance mode"):
    losses.gspo(**make_batch(), is_mode="clip")


def test_dr_grpo_aggregation_example():
  # Spec §2: losses all 1 on lengths 2 and 4, C=8, B=2: (2+4)/(2·8)=0.375; verl: 6/8=0.75.
  l = jnp.ones((2, 5))
  m = jnp.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], bool)
  got = losses.aggregate_loss(l, m, "seq-mean-token-sum-norm-batch", norm_constant=8.0)
  np.testing.assert_allclose(got, 0.375, atol=1e-6)
  got = losses.aggregate_loss(l, m, "seq-mean-token-sum-norm", norm_constant=8.0)
  np.testing.assert_allclose(got, 0.75, atol=1e-6)
  # C is a constant: a wider padded T and an extra empty row do not leak into it.
  l2 = jnp.ones((3, 9))
  m2 = jnp.zeros((3, 9), bool).at[:2, :5].set(m)
  np.testing.assert_allclose(
      losses.aggregate_loss(l2, m2, "seq-mean-token-sum-norm", norm_constant=8.0), 0.75)
  np.testing.assert_allclose(
      losses.aggregate_loss(l2, m2, "seq-mean-token-sum-norm-batch", norm_constant=8.0), 0.375)


@given(hnp.arrays(np.float32, (B, T), elements=st.floats(-10, 10, width=32)),
       hnp.arrays(np.bool_, (B, T)), st.sampled_from(losses.AGG_MODES))
def test_aggregate_matches_numpy(l, m, mode):
  got = losses.aggregate_loss(l, m, mode, norm_constant=7.0)
  np.testing.assert_allclose(got, np_aggregate(l, m, mode, C=7.0), rtol=1e-5, atol=1e-5)


def test_aggregate_ignores_nan_outside_mask_and_empty_is_zero():
  l = jnp.array([[1.0, jnp.nan], [jnp.inf, 2.0]])
  m = jnp.array([[True, False], [False, True]])
  for mode in losses.AGG_MODES:
    assert np.isfinite(losses.aggregate_loss(l, m, mode, norm_constant=4.0))
    assert losses.aggregate_loss(l, jnp.zeros_like(m), mode, norm_constant=4.0) == 0.0
    g = jax.grad(lambda x: losses.aggregate_loss(x, m, mode, norm_constant=4.0))(l)
    assert np.all(np.isfinite(g)) and g[0, 1] == 0 and g[1, 0] == 0


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregate_microbatches_sum_to_full(mode):
  rng = np.random.default_rng(1)
  l = rng.normal(size=(B, T)).astype(np.float32)
  m = make_batch(2)["response_mask"]
  f = lambda x, mm, **kw: losses.aggregate_loss(x, mm, mode, norm_constant=9.0, **kw)
  full, g_full = jax.value_and_grad(f)(l, m)
  kw = dict(num_tokens_global=m.sum(), num_seqs_global=m.any(1).sum())
  parts = [jax.value_and_grad(f)(l[i:i + 2], m[i:i + 2], **kw) for i in range(0, B, 2)]
  np.testing.assert_allclose(sum(p[0] for p in parts), full, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), g_full, rtol=1e-5,
                             atol=1e-7)


# --------------------------------------------------------------------------
# Spec worked examples.
# --------------------------------------------------------------------------


def _one(lp, old, adv, mask=None):
  lp = np.asarray(lp, np.float32).reshape(1, -1)
  return dict(logprob=lp, logprob_old=np.asarray(old, np.float32).reshape(1, -1),
              advantages=np.broadcast_to(np.float32(adv), lp.shape).copy(),
              response_mask=np.ones(lp.shape, bool) if mask is None else np.asarray(mask))


def test_grpo_ppo_clip_example():
  # Spec §1: A=0.866024, logp_old=-1, logp_new=-0.7 -> ratio 1.349859 clipped at 1.2.
  loss, metrics, g = run("ppo_clip", _one(-0.7, -1.0, 0.866024),
                         {"clip_low": 0.2, "clip_high": 0.2})
  np.testing.assert_allclose(loss, -1.039229, atol=1e-5)
  np.testing.assert_allclose(metrics["ratio_mean"], 1.349859, atol=1e-5)
  assert metrics["clipfrac"] == 1.0 and g["logprob"][0, 0] == 0.0
  np.testing.assert_allclose(metrics["approx_kl"], -0.3, atol=1e-6)


def test_dapo_clip_higher_example():
  # Spec §7: ratio 1.25 with A>0 is unclipped at ε_high=0.28, clipped at 1.2 under GRPO.
  b = _one(math.log(1.25), 0.0, 1.0)
  loss, _, g = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": 0.28})
  np.testing.assert_allclose(loss, -1.25, atol=1e-5)
  np.testing.assert_allclose(g["logprob"], [[-1.25]], atol=1e-5)
  loss, _, g = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": 0.2})
  np.testing.assert_allclose(loss, -1.2, atol=1e-5)
  np.testing.assert_allclose(g["logprob"], [[0.0]])


def test_dcpo_bounds_table():
  # Spec §8: q=0.9 -> [0.768742, 1.187184]; q=0.5 -> [0.5, 1.306226]; q=0.01 -> [0.5, 5.0].
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
  # Spec §6: log-ratios [0.02, 0.04] -> s = 1.030455 > 1.0004, value -1.0004, zero gradient.
  b = _one(np.array([-1.0, -2.0, 0.0]) + [0.02, 0.04, 0.0], [-1.0, -2.0, 0.0], 1.0,
           [[True, True, False]])
  loss, metrics, g = run("gspo", b)
  np.testing.assert_allclose(loss, -1.0004, atol=1e-6)
  np.testing.assert_allclose(metrics["seq_ratio_mean"], 1.030455, atol=1e-5)
  np.testing.assert_array_equal(g["logprob"], np.zeros((1, 3)))
  # [0.1, -0.3, 0.2] -> s = 1, unclipped: the gradient is -A·s/|o| on every token.
  b = _one(np.array([-1.0, -1.5, -0.5]) + [0.1, -0.3, 0.2], [-1.0, -1.5, -0.5], 1.0)
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


# --------------------------------------------------------------------------
# Every loss: references and properties.
# --------------------------------------------------------------------------


class PolicyLossTest(parameterized.TestCase):

  @parameterized.named_parameters((n, n) for n in NAMES)
  @given(b=batches)
  def test_matches_numpy_reference(self, name, b):
    want_l = np_token_loss(name, b["logprob"], b["logprob_old"], b["advantages"],
                           b["response_mask"])
    assume(want_l is not None)
    want = np_aggregate(want_l, b["response_mask"], DEFAULT_MODE[name])
    loss, metrics, g = run(name, b)
    scale = max(1.0, float(np.abs(want_l).max()))
    np.testing.assert_allclose(loss, want, rtol=1e-4, atol=2e-5 * scale)
    assert all(np.isfinite(v) for v in metrics.values())
    assert np.all(np.isfinite(g["logprob"]))

  @parameterized.named_parameters((n, n) for n in NAMES)
  def test_jit_equals_eager(self, name):
    b = make_batch(6)
    loss_j, metrics_j, g_j = run(name, b)
    vg = jax.value_and_grad(lambda lp: tuple(fn_of(name)(**{**b, "logprob": lp})),
                            has_aux=True)
    (loss_e, metrics_e), g_e = vg(b["logprob"])
    np.testing.assert_allclose(loss_j, loss_e, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_j["logprob"], g_e, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(metrics_j, metrics_e, rtol=1e-5, atol=1e-6)
    assert {"approx_kl", "ratio_mean", "ratio_max", "ratio_min"} <= set(metrics_e)

  @parameterized.named_parameters((n, n) for n in NAMES)
  def test_mask_equals_slice_and_padding_invariance(self, name):
    # The batch is padded to T with two dead columns and holds empty rows; everything
    # outside the mask is garbage (NaN, ±inf). Results equal those of the sliced batch.
    b = make_batch(7)
    b["response_mask"][:, T - 2:] = False
    b["response_mask"][[2, 5]] = False
    m = b["response_mask"]
    rows = m.any(1)
    sliced = {k: v[rows][:, :T - 2] for k, v in b.items()}
    junk = np.where(np.arange(T) % 2 == 0, np.nan, np.inf).astype(np.float32)
    padded = {k: v if v.dtype == bool else np.where(m, v, junk) for k, v in b.items()}
    loss_s, metrics_s, g_s = run(name, sliced)
    loss_p, metrics_p, g_p = run(name, padded)
    np.testing.assert_allclose(loss_p, loss_s, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(metrics_p, metrics_s, rtol=1e-5, atol=1e-6)
    for k in _DIFF:
      assert np.all(np.isfinite(g_p[k])) and np.all(g_p[k][~m] == 0), k
    np.testing.assert_allclose(g_p["logprob"][rows][:, :T - 2], g_s["logprob"], rtol=1e-5,
                               atol=1e-6)

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
    if name not in ("dro", "kl_cov"):  # their δ² / |δ| penalties do not vanish with A = 0
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
    smp = {**b, "logprob_sampler": b["logprob_old"] + 0.05}
    _, _, g = run(name, smp)
    for k in ("logprob_old", "advantages", "logprob_sampler"):
      np.testing.assert_array_equal(g[k], 0.0, err_msg=k)

  @parameterized.named_parameters((n, n) for n in NAMES)
  def test_sharded_equals_unsharded(self, name):
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()), ("data",))
    b = make_batch(11)
    loss0, metrics0, g0 = run(name, b)
    shard = NamedSharding(mesh, P("data", None))
    loss1, metrics1, g1 = run(name, jax.device_put(b, shard))
    np.testing.assert_allclose(loss1, loss0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g1["logprob"], g0["logprob"], rtol=1e-5, atol=1e-7)
    chex.assert_trees_all_close(metrics1, metrics0, rtol=1e-5, atol=1e-6)


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
  full, g_full, micro, g_micro = _micro_program(name, mode)(make_batch(9))
  np.testing.assert_allclose(micro, full, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_micro, g_full, rtol=1e-5, atol=1e-6)
  assert np.any(g_full != 0)


def test_micro_cases_cover_every_mode_and_loss():
  assert {m for _, m in _MICRO_CASES} == set(losses.AGG_MODES)
  assert {n for n, _ in _MICRO_CASES} == set(ROW_LOCAL)
  assert losses.BATCH_COUPLED_LOSSES == {"clip_cov", "kl_cov"}


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
  b = _one([math.log(5.0)] * 2, [0.0, 0.0], 1.0)
  b["advantages"] = np.array([[-1.0, 1.0]], np.float32)
  loss, metrics, _ = run("ppo_clip", b, {"clip_low": 0.2, "clip_high": 0.2},
                         loss_agg_mode="token-sum")
  np.testing.assert_allclose(loss, 3.0 - 1.2, atol=1e-5)  # min(5, c=3)·|A| and -1.2
  assert metrics["clipfrac_lower"] == 0.5
  with pytest.raises(ValueError, match="clip_ratio_c"):
    losses.ppo_clip(**b, clip_ratio_c=0.5)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_on_policy_gradient_is_reinforce(name):
  # At ratio 1 (log π = log π_old) every loss's gradient is the REINFORCE gradient
  # −A∇log π (GPG) under the loss's aggregation; LUSPO's |o| scaling turns the
  # per-sequence token mean into a token sum.
  b = make_batch(13)
  b["logprob"] = b["logprob_old"].copy()
  mode = DEFAULT_MODE[name] if name != "luspo" else "seq-mean-token-sum"
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


def test_gmpo_clips_in_log_space_and_averages_geometrically():
  # One row, A=1, token log-ratios [1.0, -0.2]: the first is clipped to 0.4 (A>0 upper
  # bound), so r = exp((0.4 - 0.2)/2) and the loss is -r.
  loss, metrics, g = run("gmpo", _one([0.0, -0.2], [-1.0, 0.0], 1.0))
  np.testing.assert_allclose(loss, -math.exp(0.1), rtol=1e-6)
  assert metrics["clipfrac"] == 0.5
  np.testing.assert_allclose(g["logprob"], [[0.0, -math.exp(0.1) / 2]], rtol=1e-5, atol=1e-7)


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


# --------------------------------------------------------------------------
# Importance correction (TIS / MIS).
# --------------------------------------------------------------------------


def np_importance(old, smp, m, level, mode, C, lo):
  log_r = np.where(m, old.astype(np.float64) - smp, 0.0)
  if level == "token":
    raw = log_r
  elif level == "sequence":
    raw = np.repeat(log_r.sum(1, keepdims=True), log_r.shape[1], 1)
  else:
    raw = np.repeat(log_r.sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1),
                    log_r.shape[1], 1)
  w = np.exp(np.clip(raw, -20, 20))
  if mode == "truncate":
    return np.where(m, np.minimum(w, C), 0.0), m, raw
  keep = m & (w <= C) & (w >= (lo or 0.0))
  return np.where(keep, w, 0.0), keep, raw


_ic_jit = jax.jit(losses.importance_correction,
                  static_argnames=("level", "mode"))


@given(hnp.arrays(np.float32, (B, T), elements=st.floats(-1, 1, width=32)),
       st.sampled_from(["token", "sequence", "geometric"]), st.sampled_from(["truncate", "mask"]),
       st.sampled_from([None, 0.5]))
def test_importance_correction_matches_numpy(noise, level, mode, lo):
  b = make_batch(18)
  smp = b["logprob_old"] + noise
  w, keep, raw = np_importance(b["logprob_old"], smp, b["response_mask"], level, mode, 2.0, lo)
  bounds = [math.log(2.0)] + ([math.log(lo)] if lo else [])
  assume(all(np.all(np.abs(raw - x) > 1e-4) for x in bounds))  # no float32 coin flips
  out = _ic_jit(logprob_old=b["logprob_old"], logprob_sampler=smp,
                response_mask=b["response_mask"], level=level, mode=mode, threshold=2.0,
                threshold_lower=lo)
  np.testing.assert_allclose(out.weights, w, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(out.mask, keep)
  m = b["response_mask"]
  np.testing.assert_allclose(out.metrics.get("is_frac_rejected", 0.0),
                             (m & ~keep).sum() / m.sum(), rtol=1e-6)
  assert ("is_frac_rejected" in out.metrics) == (mode == "mask")
  np.testing.assert_allclose(out.metrics["is_weight_mean"], w[m].mean(), rtol=1e-4)
  assert all(np.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", NAMES)
def test_losses_scale_by_truncated_importance_weights(name):
  # Constant weights w (truncate mode, no rejection): the loss scales by w below the
  # threshold C=2 and by C above it, in any aggregation; sampler == old changes nothing.
  b = make_batch(19)
  base, _, g_base = run(name, b)
  for w, want in [(1.0, 1.0), (0.7, 0.7), (5.0, 2.0)]:
    smp = b["logprob_old"] - np.float32(math.log(w))
    loss, metrics, g = run(name, {**b, "logprob_sampler": smp})
    np.testing.assert_allclose(loss, want * base, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g["logprob"], want * g_base["logprob"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["is_weight_mean"], want, rtol=1e-5)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gmpo", "vespo"])
def test_sequence_mask_rejection_equals_dropping_rows(name):
  # Rows whose sequence ratio exceeds C are rejected: the loss (default aggregation, with
  # its denominators) equals the loss of the batch without those rows. The rejection is
  # shared code (`_finish`); token-mean, seq-mean-token-mean and row-level losses cover it.
  b = make_batch(23)
  bad = np.zeros(B, bool)
  bad[[1, 4]] = True
  smp = b["logprob_old"] - np.where(bad[:, None], 0.5, 0.0).astype(np.float32)
  loss, metrics, _ = run(name, {**b, "logprob_sampler": smp}, {"is_threshold": 1.2},
                         is_level="sequence", is_mode="mask")
  kept, _, _ = run(name, {**b, "response_mask": b["response_mask"] & ~bad[:, None]})
  np.testing.assert_allclose(loss, kept, rtol=1e-5, atol=1e-6)
  m = b["response_mask"]
  np.testing.assert_allclose(metrics["is_frac_rejected"], m[bad].sum() / m.sum(), rtol=1e-6)


# --------------------------------------------------------------------------
# Entropy bonus and value loss.
# --------------------------------------------------------------------------


def test_entropy_bonus():
  b = make_batch(21)
  h = np.abs(b["logprob"])
  m = b["response_mask"]
  out = losses.entropy_bonus(entropy=h, response_mask=m, coef=0.01)
  np.testing.assert_allclose(out.loss, -0.01 * h[m].mean(), rtol=1e-6)
  np.testing.assert_allclose(out.metrics["entropy"], h[m].mean(), rtol=1e-6)
  g = jax.grad(lambda x: losses.entropy_bonus(entropy=x, response_mask=m, coef=0.01).loss)(h)
  np.testing.assert_allclose(g, np.where(m, -0.01 / m.sum(), 0.0), rtol=1e-6)
  out = losses.entropy_bonus(entropy=h, response_mask=m, coef=1.0,
                             loss_agg_mode="seq-mean-token-mean")
  np.testing.assert_allclose(out.loss, -np_aggregate(h, m, "seq-mean-token-mean"), rtol=1e-6)


_value_loss_jit = jax.jit(lambda v, vo, r, m: losses.value_loss(
    values=v, values_old=vo, returns=r, response_mask=m))


@given(hnp.arrays(np.float32, (B, T), elements=st.floats(-3, 3, width=32)),
       hnp.arrays(np.float32, (B, T), elements=st.floats(-3, 3, width=32)),
       hnp.arrays(np.float32, (B, T), elements=st.floats(-3, 3, width=32)))
def test_value_loss_matches_numpy(v, v_old, ret):
  m = make_batch(22)["response_mask"]
  got = _value_loss_jit(v, v_old, ret, m)
  l = np.zeros((B, T))
  for i in range(B):
    for t in range(T):
      vc = min(max(v[i, t], v_old[i, t] - 0.5), v_old[i, t] + 0.5)
      l[i, t] = max((float(v[i, t]) - ret[i, t]) ** 2, (vc - ret[i, t]) ** 2)
  np.testing.assert_allclose(got.loss, 0.5 * l[m].mean(), rtol=1e-5, atol=1e-5)


def test_value_loss_example_gradients_and_unclipped():
  # V=2, V_old=1, R=0, c=0.5: clipped 1.5 -> max(4, 2.25) = 4 -> 0.5·4 = 2; dL/dV = V − R.
  one = jnp.ones((1, 1))
  f = lambda v, vo, r: losses.value_loss(values=v, values_old=vo, returns=r,
                                         response_mask=one > 0).loss
  np.testing.assert_allclose(f(2 * one, one, 0 * one), 2.0)
  gv, gvo, gr = jax.grad(f, argnums=(0, 1, 2))(2 * one, one, 0 * one)
  np.testing.assert_allclose(gv, [[2.0]])
  np.testing.assert_array_equal(gvo, 0.0)
  np.testing.assert_array_equal(gr, 0.0)
  # V=0.2, V_old=1, R=0.5: clip(V) = 0.5 hits R exactly; max(0.09, 0) = 0.09 -> 0.045.
  np.testing.assert_allclose(f(0.2 * one, one, 0.5 * one), 0.045, atol=1e-7)
  unc = losses.value_loss(values=2 * one, values_old=one, returns=0 * one,
                          response_mask=one > 0, clip_range_value=None)
  np.testing.assert_allclose(unc.loss, 2.0)
