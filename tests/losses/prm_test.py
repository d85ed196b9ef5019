"""Tests for the implicit-PRM training objectives (credit/losses/prm.py).

The numpy references are float64 loops written from the formulas (PRIME's CE loss, the
ImplicitPRM losses).
"""
from __future__ import annotations

import functools
import math

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import credit
from credit.losses import prm

B, T, P = 8, 6, 5

# PRIME's example (§1/§2): q rows of lengths 3, 2, 3; labels [1, 0, 1]; β = 0.05.
Q = np.array([[0.2, -0.1, 0.3], [0.0, 0.1, 0.0], [-0.2, -0.2, 0.1]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], bool)
LABELS = np.array([1.0, 0.0, 1.0], np.float32)


def _sig(x):
  return 1.0 / (1.0 + math.exp(-x))


def _rows(mask, prm_, ref):
  out = []
  for b in range(mask.shape[0]):
    ts = [t for t in range(mask.shape[1]) if mask[b, t]]
    out.append(sum(float(prm_[b, t]) - float(ref[b, t]) for t in ts) if ts else None)
  return out


def ref_ce(mask, prm_, ref, labels, beta):
  terms = []
  for lr, l in zip(_rows(mask, prm_, ref), labels):
    if lr is None:
      continue
    s = beta * lr
    terms.append(-(l * math.log(_sig(s)) + (1 - l) * math.log(_sig(-s))))
  return sum(terms) / max(len(terms), 1)


def ref_dpo(mask, prm_, ref, ci, ri, pm, beta):
  lrs = _rows(mask, prm_, ref)
  terms = [-math.log(_sig(beta * (lrs[c] - lrs[r])))
           for c, r, ok in zip(ci, ri, pm)
           if ok and 0 <= c < len(lrs) and 0 <= r < len(lrs)
           and lrs[c] is not None and lrs[r] is not None]
  return sum(terms) / max(len(terms), 1)


def ref_kto(mask, prm_, ref, labels, beta, wd, wu, kl=None):
  lrs = _rows(mask, prm_, ref)
  valid = [x for x in lrs if x is not None]
  z = max(kl if kl is not None else (sum(valid) / len(valid) if valid else 0.0), 0.0)
  terms = []
  for lr, l in zip(lrs, labels):
    if lr is None:
      continue
    terms.append(wd * (1 - _sig(beta * (lr - z))) if l >= 0.5
                 else wu * (1 - _sig(beta * (z - lr))))
  return sum(terms) / max(len(terms), 1)


def ref_vanilla_kto(mask, prm_, ref, labels, beta):
  lrs = _rows(mask, prm_, ref)
  good = [x for x, l in zip(lrs, labels) if x is not None and l >= 0.5]
  bad = [x for x, l in zip(lrs, labels) if x is not None and l < 0.5]
  zg = max(sum(good) / len(good), 0.0) if good else 0.0
  zb = max(sum(bad) / len(bad), 0.0) if bad else 0.0
  terms = ([1 - _sig(beta * (x - zb)) for x in good] + [1 - _sig(beta * (zg - x)) for x in bad])
  return sum(terms) / max(len(terms), 1)


@st.composite
def batches(draw):
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):
    mask &= rng.random((B, T)) > 0.3
  labels = rng.choice([0.0, 1.0], B).astype(np.float32)
  scale = draw(st.sampled_from([0.3, 3.0]))
  lp = (rng.normal(size=(B, T)) * scale - 2).astype(np.float32)
  ref = (rng.normal(size=(B, T)) * scale - 2).astype(np.float32)
  ci = rng.integers(-1, B, P).astype(np.int32)
  ri = rng.integers(0, B, P).astype(np.int32)
  pm = rng.random(P) > 0.2
  return dict(mask=mask, lp=lp, ref=ref, labels=labels, ci=ci, ri=ri, pm=pm)


@functools.lru_cache(maxsize=None)
def jitted(name):
  return jax.jit(getattr(prm, name))


def _common(b):
  return dict(logprob_prm=b["lp"], logprob_ref=b["ref"], response_mask=b["mask"])


def test_exported():
  for name in ("prm_ce_loss", "prm_dpo_loss", "prm_kto_loss", "prm_vanilla_kto_loss"):
    assert getattr(credit.losses, name) is getattr(prm, name)
  assert "code-verified" in prm.__doc__


def test_spec_examples():
  kw = dict(logprob_prm=Q, logprob_ref=np.zeros_like(Q), response_mask=MASK)
  out = prm.prm_ce_loss(reward=LABELS, **kw)
  np.testing.assert_allclose(float(out.loss), 0.69317, atol=1e-5)
  np.testing.assert_allclose(float(out.metrics["prm_score_mean"]), (0.02 + 0.005 - 0.015) / 3,
                             atol=1e-6)
  # Signs of s = [0.02, 0.005, −0.015] vs labels [1, 0, 1]: one of three right.
  np.testing.assert_allclose(float(out.metrics["prm_accuracy"]), 1 / 3, atol=1e-6)
  dpo = prm.prm_dpo_loss(chosen_index=np.array([0]), rejected_index=np.array([1]), **kw)
  np.testing.assert_allclose(float(dpo.loss), 0.68568, atol=1e-5)
  assert float(dpo.metrics["prm_pair_accuracy"]) == 1.0


@hypothesis.settings(max_examples=15)
@hypothesis.given(b=batches(), beta=st.sampled_from([0.05, 0.5]))
def test_matches_numpy_references(b, beta):
  c = _common(b)
  got = jitted("prm_ce_loss")(reward=b["labels"], beta=beta, **c).loss
  np.testing.assert_allclose(float(got), ref_ce(b["mask"], b["lp"], b["ref"], b["labels"],
                                                beta), rtol=1e-4, atol=1e-6)
  got = jitted("prm_dpo_loss")(chosen_index=b["ci"], rejected_index=b["ri"],
                               pair_mask=b["pm"], beta=beta, **c).loss
  np.testing.assert_allclose(float(got), ref_dpo(b["mask"], b["lp"], b["ref"], b["ci"],
                                                 b["ri"], b["pm"], beta), rtol=1e-4, atol=1e-6)
  got = jitted("prm_kto_loss")(reward=b["labels"], beta=beta, desirable_weight=1.0,
                               undesirable_weight=1.5, **c).loss
  np.testing.assert_allclose(float(got), ref_kto(b["mask"], b["lp"], b["ref"], b["labels"],
                                                 beta, 1.0, 1.5), rtol=1e-4, atol=1e-6)
  got = jitted("prm_kto_loss")(reward=b["labels"], beta=beta, kl_reference=0.7, **c).loss
  np.testing.assert_allclose(float(got), ref_kto(b["mask"], b["lp"], b["ref"], b["labels"],
                                                 beta, 1.0, 1.0, kl=0.7), rtol=1e-4, atol=1e-6)
  got = jitted("prm_vanilla_kto_loss")(reward=b["labels"], beta=beta, **c).loss
  np.testing.assert_allclose(float(got), ref_vanilla_kto(b["mask"], b["lp"], b["ref"],
                                                         b["labels"], beta),
                             rtol=1e-4, atol=1e-6)


def _grad(fn, b, **kw):
  def loss(lp, ref):
    return fn(logprob_prm=lp, logprob_ref=ref, response_mask=b["mask"], **kw).loss
  return jax.grad(loss, argnums=(0, 1))(jnp.asarray(b["lp"]), jnp.asarray(b["ref"]))


@hypothesis.settings(max_examples=8)
@hypothesis.given(b=batches())
def test_gradients_flow_into_the_prm_only_and_not_under_the_mask(b):
  nan = dict(b, lp=np.where(b["mask"], b["lp"], np.nan).astype(np.float32),
             ref=np.where(b["mask"], b["ref"], np.nan).astype(np.float32))
  cases = [(prm.prm_ce_loss, dict(reward=b["labels"])),
           (prm.prm_dpo_loss, dict(chosen_index=b["ci"], rejected_index=b["ri"])),
           (prm.prm_kto_loss, dict(reward=b["labels"])),
           (prm.prm_vanilla_kto_loss, dict(reward=b["labels"]))]
  for fn, kw in cases:
    g_lp, g_ref = _grad(fn, nan, **kw)
    g_lp, g_ref = np.asarray(g_lp), np.asarray(g_ref)
    assert np.all(np.isfinite(g_lp)) and np.all(g_lp[~b["mask"]] == 0.0), fn.__name__
    assert np.all(g_ref == 0.0), fn.__name__
    clean = fn(**_common(b), **kw)
    dirty = fn(**_common(nan), **kw)
    np.testing.assert_array_equal(np.asarray(clean.loss), np.asarray(dirty.loss))


def test_ce_gradient_is_beta_times_sigmoid_residual():
  # ∂L/∂ log π_φ(y_t) = β (σ(s) − l) / n on every valid token of the row.
  kw = dict(logprob_ref=np.zeros_like(Q), response_mask=MASK, reward=LABELS, beta=0.05)
  g = jax.grad(lambda lp: prm.prm_ce_loss(logprob_prm=lp, **kw).loss)(jnp.asarray(Q))
  s = 0.05 * (Q * MASK).sum(1)
  want = 0.05 * (1 / (1 + np.exp(-s)) - LABELS) / 3
  np.testing.assert_allclose(np.asarray(g), want[:, None] * MASK, rtol=1e-5, atol=1e-8)


def test_kto_reference_point_is_detached_but_vanilla_is_not_by_default():
  rng = np.random.default_rng(0)
  lp = jnp.asarray(rng.normal(size=(4, 3)).astype(np.float32) + 1.0)
  kw = dict(logprob_ref=np.zeros((4, 3), np.float32), response_mask=np.ones((4, 3), bool),
            reward=np.array([1., 1., 0., 0.], np.float32), beta=0.5)
  # Moving only a desirable row shifts z_D, which enters the undesirable terms (vanilla).
  def f(fn, **extra):
    def loss(x):
      return fn(logprob_prm=lp.at[0, 0].set(x), **kw, **extra).loss
    return float(jax.grad(loss)(lp[0, 0]))
  van = f(prm.prm_vanilla_kto_loss)
  van_sg = f(prm.prm_vanilla_kto_loss, stop_reference_gradient=True)
  assert van != pytest.approx(van_sg)
  # With z detached the gradient of row 0 is its own term only.
  s0 = 0.5 * (float(jnp.sum(lp[0])) - float(prm.prm_vanilla_kto_loss(
      logprob_prm=lp, **kw).metrics["prm_kl_incorrect"]))
  np.testing.assert_allclose(van_sg, -0.5 * _sig(s0) * (1 - _sig(s0)) / 4, rtol=1e-5)


def test_empty_rows_classes_and_pairs_are_finite_zero():
  z = np.zeros((4, 3), np.float32)
  empty = np.zeros((4, 3), bool)
  for out in (prm.prm_ce_loss(logprob_prm=z, logprob_ref=z, response_mask=empty,
                              reward=np.ones(4, np.float32)),
              prm.prm_kto_loss(logprob_prm=z, logprob_ref=z, response_mask=empty,
                               reward=np.ones(4, np.float32)),
              prm.prm_vanilla_kto_loss(logprob_prm=z, logprob_ref=z, response_mask=empty,
                                       reward=np.ones(4, np.float32)),
              prm.prm_dpo_loss(logprob_prm=z, logprob_ref=z, response_mask=empty,
                               chosen_index=np.array([0]), rejected_index=np.array([1]))):
    assert float(out.loss) == 0.0
    assert all(np.isfinite(np.asarray(v)) for v in out.metrics.values())
  # One class only (vanilla KTO): the other reference point is 0, not NaN.
  out = prm.prm_vanilla_kto_loss(logprob_prm=z + 0.1, logprob_ref=z,
                                 response_mask=np.ones((4, 3), bool),
                                 reward=np.ones(4, np.float32))
  np.testing.assert_allclose(float(out.loss), 1 - _sig(0.05 * 0.3), rtol=1e-6)


def test_masked_rows_equal_sliced_rows():
  rng = np.random.default_rng(3)
  lp = rng.normal(size=(B, T)).astype(np.float32)
  ref = rng.normal(size=(B, T)).astype(np.float32)
  mask = np.ones((B, T), bool)
  labels = rng.choice([0., 1.], B).astype(np.float32)
  drop = np.zeros(B, bool)
  drop[[1, 4]] = True
  for fn in (prm.prm_ce_loss, prm.prm_kto_loss, prm.prm_vanilla_kto_loss):
    a = fn(logprob_prm=lp, logprob_ref=ref, response_mask=mask & ~drop[:, None], reward=labels)
    b = fn(logprob_prm=lp[~drop], logprob_ref=ref[~drop], response_mask=mask[~drop],
           reward=labels[~drop])
    np.testing.assert_allclose(float(a.loss), float(b.loss), rtol=1e-6)


def test_bad_shapes_raise():
  z = np.zeros((4, 3), np.float32)
  with pytest.raises(AssertionError):
    prm.prm_ce_loss(logprob_prm=z, logprob_ref=np.zeros((4, 2), np.float32),
                    response_mask=np.ones((4, 3), bool), reward=np.ones(4, np.float32))
  with pytest.raises(AssertionError):
    prm.prm_ce_loss(logprob_prm=z, logprob_ref=z, response_mask=np.ones((4, 3), bool),
                    reward=np.ones(3, np.float32))
  with pytest.raises(AssertionError):
    prm.prm_dpo_loss(logprob_prm=z, logprob_ref=z, response_mask=np.ones((4, 3), bool),
                     chosen_index=np.array([0., 1.]), rejected_index=np.array([1., 2.]))
  with pytest.raises(AssertionError):
    prm.prm_kto_loss(logprob_prm=z, logprob_ref=z, response_mask=np.ones((4, 3), bool),
                     reward=np.ones(4, np.float32), kl_reference=np.ones(2, np.float32))
