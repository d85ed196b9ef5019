"""VERPO (credit/advantages/distill/verpo.py).

Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import verpo
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_steps import (B, G, N, T, call, make_batch, pick,
                                                 ref_verpo)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher")
CONFIGS = {
    "default": dict(),
    "fast_alt_reference": dict(group_size=G, use_alt_reference=True, gamma0=0.3, rho=0.5),
    "wide_cheap": dict(rho=0.6, lambda_fisher=4.0, group_std="none"),
}


CASES = table(verpo.verpo_advantages,
              lambda cfg: FIELDS + (("logprob_alt",) if cfg.get("use_alt_reference") else ()),
              ref_verpo, CONFIGS, batch=make_batch, num_groups=N, seeds=(0,),
              default_seeds=(0, 1), rtol=1e-4, atol=1e-5)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("verpo")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)
  assert spec.needs_for({"use_alt_reference": True}) == set(FIELDS) | {"logprob_alt"}


def test_doctests():
  res = doctest.testmod(verpo, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  # Â = −0.5, e = [−0.4, 0.3, −0.05], p = [.5, .5, .9], top-1 of the accepted → A[0] = −0.82.
  ls = np.log(np.array([[0.5, 0.5, 0.9]] * 2, np.float32))
  a = call(verpo.verpo_advantages, reward=np.array([0.0, 1.0]), group_id=np.zeros(2, np.int32),
           response_mask=np.ones((2, 3), bool), logprob_old=ls,
           logprob_teacher=ls + np.array([[-0.4, 0.3, -0.05]] * 2, np.float32), num_groups=1,
           group_std="none")
  np.testing.assert_allclose(a[0], [-0.82, -0.5, -0.5], atol=1e-5)
  # Row 1 (Â = +0.5) accepts only the positive correction: s = min(1, .5·.3/.25) = .6.
  np.testing.assert_allclose(a[1], [0.5, 0.5 + 0.6 * 0.3, 0.5], atol=1e-5)


def test_localisation_sign_and_degenerate_groups():
  b = make_batch(4, extreme=False)
  b["reward"] = np.tile(np.array([1.0, 0.0], np.float32), B // 2)   # mixed groups
  grpo = call(grpo_advantages, **pick(b, "reward", "group_id", "response_mask"), num_groups=N)
  a = np.asarray(run(CASE["wide_cheap"], b))
  base = call(grpo_advantages, **pick(b, "reward", "group_id", "response_mask"),
              num_groups=N, scale="none")                       # Â without σ, [B,T]
  mask = b["response_mask"]
  changed = mask & ~np.isclose(a, base, atol=1e-7)
  n = mask.sum(1)
  # At most max(1, ⌊ρ n⌋) tokens per row move, only away from zero (|A| grows, sign kept).
  assert np.all(changed.sum(1) <= np.maximum(1, np.floor(np.float32(0.6) * n)))
  assert changed.any() and np.all(np.abs(a[changed]) > np.abs(base[changed]))
  assert np.all(np.sign(a) == np.sign(base))
  # The all-equal group 0 (Â = 0) gets exact zeros; teacher == student gives GRPO.
  d = np.asarray(run(CASE["default"], make_batch(5)))
  assert np.all(d[:G] == 0.0)
  same = dict(pick(b, *FIELDS), logprob_teacher=b["logprob_old"])
  np.testing.assert_allclose(np.asarray(run(CASE["default"], same)), grpo, rtol=1e-6, atol=1e-7)


def test_ties_go_to_the_earlier_token():
  ls = np.full((2, 4), np.log(0.5), np.float32)
  a = call(verpo.verpo_advantages, reward=np.array([0.0, 1.0]), group_id=np.zeros(2, np.int32),
           response_mask=np.ones((2, 4), bool), logprob_old=ls,
           logprob_teacher=ls - np.float32(0.2), num_groups=1, group_std="none")
  np.testing.assert_allclose(a[0], [-0.5 - 0.2 * 0.4, -0.5, -0.5, -0.5], atol=1e-6)


def test_alt_reference_needs_logprob_alt():
  b = make_batch(0)
  with pytest.raises(ValueError, match="logprob_alt"):
    verpo.verpo_advantages(**pick(b, *FIELDS), num_groups=N, use_alt_reference=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(group_std="sample"), "group_std"), (dict(group_size=3), "multiple"),
])
def test_bad_static_args_raise(kwargs, match):
  b = make_batch(0)
  with pytest.raises(ValueError, match=match):
    call(verpo.verpo_advantages, **pick(b, *FIELDS), num_groups=N, **kwargs)


def test_shape_mismatch_raises():
  b = make_batch(0)
  with pytest.raises(AssertionError):
    call(verpo.verpo_advantages, **dict(pick(b, *FIELDS),
                                        logprob_teacher=np.zeros((B, T + 1), np.float32)),
         num_groups=N)


# --------------------------------------------------------------------------
# Fisher Evidence Contrast (evidence_nuisance, fec=True).
# --------------------------------------------------------------------------


def _np_nuisance(h0, he, w, tok, mask, lam):
  u = np.where(mask[..., None], he - h0, 0.0)
  m = u.sum((0, 1)) / max(mask.sum(), 1)
  v = m / np.linalg.norm(m)
  kappa = (m @ m) / (m @ m + lam)
  logits = h0 @ w
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  g = w.T[tok] - p @ w.T                      # [B,T,D]: ∂ log p(y_t) / ∂h
  return np.where(mask, kappa * (g @ v) * (u @ v), 0.0)


@pytest.mark.parametrize("chunk", [None, 3])
def test_evidence_nuisance_matches_numpy(chunk):
  rng = np.random.default_rng(0)
  Bn, Tn, D, V = 3, 7, 5, 11
  h0 = rng.normal(size=(Bn, Tn, D)).astype(np.float32)
  he = (h0 + rng.normal(size=(Bn, Tn, D)) * 0.3 + np.arange(D) * 0.2).astype(np.float32)
  w = rng.normal(size=(D, V)).astype(np.float32)
  tok = rng.integers(0, V, size=(Bn, Tn))
  mask = rng.random((Bn, Tn)) < 0.7
  got = verpo.evidence_nuisance(hidden_plain=h0, hidden_evidence=he, unembed=w, tokens=tok,
                                mask=mask, fec_lambda=0.5, chunk_size=chunk)
  np.testing.assert_allclose(np.asarray(got), _np_nuisance(h0, he, w, tok, mask, 0.5),
                             rtol=1e-4, atol=1e-5)
  same = verpo.evidence_nuisance(hidden_plain=h0, hidden_evidence=h0, unembed=w, tokens=tok,
                                 mask=mask)
  assert np.all(np.asarray(same) == 0.0)      # no evidence shift: nothing to remove


def test_fec_subtracts_the_nuisance_from_the_correction():
  b = make_batch(0)
  n = np.where(b["response_mask"], np.random.default_rng(1).normal(size=(B, T)), 0.0)
  fields = pick(b, *FIELDS)
  with_fec = verpo.verpo_advantages(**fields, num_groups=N, fec=True,
                                    evidence_nuisance=n.astype(np.float32))
  shifted = dict(fields, logprob_teacher=np.where(b["response_mask"],
                                                  b["logprob_teacher"] - n, 0.0))
  np.testing.assert_allclose(np.asarray(with_fec),
                             np.asarray(verpo.verpo_advantages(**shifted, num_groups=N)),
                             rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="evidence_nuisance"):
    verpo.verpo_advantages(**fields, num_groups=N, fec=True)
