"""DiffGate (credit/advantages/distill/diffgate.py)."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import diffgate as dg
from tests.advantages.distill._harness import reference_test, table
from tests.advantages.distill._ref_teach import (B, G, N, T, batch, pick, ref_diffgate,
                                                 row_valid)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher")
CONFIGS = {
    "default": dict(),
    "tight": dict(coef=0.5, bound=0.3, success_threshold=0.5),
    "fast": dict(group_size=G),
}


CASES = table(dg.diffgate_advantages, FIELDS, ref_diffgate, CONFIGS)
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("diffgate")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(dg, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  lt = np.array([[0., 0.], [0.5, -2.0], [3.0, 0.1], [0., 0.]], np.float32)
  a = np.asarray(dg.diffgate_advantages(
      reward=np.array([1., 0., 0., 0.]), group_id=np.zeros(4, np.int32),
      response_mask=np.ones((4, 2), bool), logprob_old=np.zeros((4, 2), np.float32),
      logprob_teacher=lt, num_groups=1))
  np.testing.assert_allclose(a[0], [1.499997, 1.499997], atol=1e-5)
  np.testing.assert_allclose(a[1], [-0.153411, -1.223020], atol=1e-5)
  np.testing.assert_allclose(a[2], [0.246292, -0.425248], atol=1e-5)


def test_limits():
  b = batch(2)
  grpo = np.asarray(grpo_advantages(**pick(b, "reward", "group_id", "response_mask"),
                                    num_groups=N))
  kw = pick(b, *FIELDS)
  # λ = 0, or a teacher equal to the student: GRPO.
  for a in (dg.diffgate_advantages(**kw, num_groups=N, coef=0.0),
            dg.diffgate_advantages(**dict(kw, logprob_teacher=b["logprob_old"]), num_groups=N)):
    np.testing.assert_allclose(np.asarray(a), grpo, rtol=1e-6, atol=1e-6)
  # All-correct group: pure GRPO (d = 0); all-fail group: bounded OPD, |A| ≤ λκ.
  ok = b["response_mask"] & row_valid(b)[:, None]
  for r, check in ((1.0, lambda a: np.all(a[ok] == 0.0)),
                   (0.0, lambda a: np.all(np.abs(a) <= 0.7 + 1e-6) and np.any(a[ok] != 0.0))):
    a = np.asarray(dg.diffgate_advantages(**dict(kw, reward=np.full(B, r, np.float32)),
                                          num_groups=N, bound=0.7))
    assert check(a)


def test_bad_args_raise():
  b = batch(3)
  with pytest.raises(ValueError, match="group_std"):
    dg.diffgate_advantages(**pick(b, *FIELDS), num_groups=N, group_std="sample")
  with pytest.raises(AssertionError):
    dg.diffgate_advantages(**dict(pick(b, *FIELDS), logprob_old=np.zeros((B, T + 1))),
                           num_groups=N)
