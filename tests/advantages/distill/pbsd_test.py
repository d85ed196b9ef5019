"""PBSD (credit/advantages/distill/pbsd.py).

Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import dataclasses
import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import pbsd
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_steps import (B, K, N, T, call, make_batch, pick,
                                                 ref_pbsd, ref_pbsd_evidence)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher", "turn_id",
          "step_mask")
CONFIGS = {
    "default": dict(),
    "multiplicative": dict(mode="multiplicative", lam=0.8),
    "unbiased_turns": dict(ddof=1, lam=1.5, group_std="none"),
}


# Contiguous ids (seed 0) for every configuration, plus the segment path for the default.
CASES = table(pbsd.pbsd_advantages, FIELDS, ref_pbsd, CONFIGS, batch=make_batch, num_groups=N,
              seeds=(0,), contiguous=True, rtol=1e-4, atol=1e-5)
CASE = {c.id: c for c in CASES}
CASES.append(dataclasses.replace(CASE["default"], id="default_segment", seeds=(1,),
                                 contiguous=False))
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("pbsd")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)
  assert "2606.09348" in spec.paper


def test_doctests():
  res = doctest.testmod(pbsd, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  # teacher − student = [.2, −.1, .4, (obs), −1.0] over turns [0,0,1,1,2] → e = [.1, .4, −1.0].
  e = call(pbsd.pbsd_turn_evidence, response_mask=np.array([[1, 1, 1, 0, 1]], bool),
           logprob_old=np.array([[-0.7, -0.9, -0.6, -0.3, -1.0]], np.float32),
           logprob_teacher=np.array([[-0.5, -1.0, -0.2, -0.3, -2.0]], np.float32),
           turn_id=np.array([[0, 0, 1, 1, 2]], np.int32), num_turns=3)
  np.testing.assert_allclose(e[0], [0.1, 0.4, -1.0], atol=1e-5)
  np.testing.assert_allclose(e.sum(), -0.5, atol=1e-5)


def test_evidence_matches_reference_and_ignores_observations():
  b = make_batch(2)
  e = call(pbsd.pbsd_turn_evidence, **pick(b, "response_mask", "logprob_old",
                                           "logprob_teacher", "turn_id"), num_turns=K)
  np.testing.assert_allclose(e, ref_pbsd_evidence(b)[0], rtol=1e-5, atol=1e-5)
  obs = ~b["response_mask"]
  noisy = dict(b, logprob_teacher=np.where(obs, -3.0, b["logprob_teacher"]).astype(np.float32))
  np.testing.assert_allclose(
      call(pbsd.pbsd_turn_evidence, **pick(noisy, "response_mask", "logprob_old",
                                           "logprob_teacher", "turn_id"), num_turns=K), e)


def test_reductions():
  b = make_batch(3, extreme=False)
  grpo = call(grpo_advantages, **pick(b, "reward", "group_id", "response_mask"), num_groups=N)
  same = dict(pick(b, *FIELDS), logprob_teacher=b["logprob_old"])   # e ≡ 0
  np.testing.assert_allclose(np.asarray(run(CASE["default"], same)), grpo, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(call(pbsd.pbsd_advantages, **pick(b, *FIELDS), num_groups=N,
                                  lam=0.0), grpo, rtol=1e-6, atol=1e-7)
  # Multiplicative with λ ≤ 1 keeps the sign of Â (and an all-equal group gets 0).
  a = np.asarray(run(CASE["multiplicative"], b))
  assert np.all(np.sign(a) == np.sign(grpo))


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="both"), "mode"), (dict(ddof=2), "ddof"), (dict(group_std="sample"), "group_std"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  b = make_batch(0)
  with pytest.raises(ValueError, match=match):
    call(pbsd.pbsd_advantages, **dict(pick(b, *FIELDS), **kwargs), num_groups=N)


def test_shape_mismatch_raises():
  b = make_batch(0)
  with pytest.raises(AssertionError):
    call(pbsd.pbsd_advantages, **dict(pick(b, *FIELDS), turn_id=np.zeros((B, T + 1), np.int32)),
         num_groups=N)
