"""OPD (credit/advantages/distill/opd.py).

Registry-wide properties (jit/eager, masking, padding, degenerate batches) live in
tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest

import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import opd
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_teach import B, G, N, T, batch, pick, ref_opd

FIELDS = ("response_mask", "logprob_old", "logprob_teacher")
CONFIGS = {
    "default": dict(),
    "mixture": dict(kl_coef=0.5, outcome_coef=2.0),
    "mixture_fast": dict(outcome_coef=1.0, group_size=G),
}


CASES = table(opd.opd_advantages,
              lambda cfg: FIELDS + (("reward", "group_id") if cfg.get("outcome_coef") else ()),
              ref_opd, CONFIGS)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("opd")
  assert spec.family == "distill" and spec.confidence == "paper-equation"
  assert spec.needs == set(FIELDS)
  assert spec.needs_for({"outcome_coef": 1.0}) == set(FIELDS) | {"reward", "group_id"}


def test_doctests():
  res = doctest.testmod(opd, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  a = opd.opd_advantages(response_mask=np.ones((1, 3), bool),
                         logprob_old=np.array([[-0.5, -1.0, -2.0]], np.float32),
                         logprob_teacher=np.array([[-0.3, -1.5, -0.1]], np.float32))
  np.testing.assert_allclose(np.asarray(a[0]), [0.2, -0.5, 1.9], atol=1e-5)


def test_teacher_equal_to_student_gives_zero_or_grpo():
  b = batch(2)
  same = dict(b, logprob_teacher=b["logprob_old"])
  assert np.all(np.asarray(run(CASE["default"], same)) == 0.0)
  mix = opd.opd_advantages(**pick(same, *FIELDS, "reward", "group_id"), num_groups=N,
                           outcome_coef=1.0)
  want = grpo_advantages(**pick(b, "reward", "group_id", "response_mask"), num_groups=N)
  np.testing.assert_allclose(np.asarray(mix), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_zero_probability_teacher_is_clamped():
  a = opd.opd_advantages(response_mask=np.ones((1, 2), bool),
                         logprob_old=np.array([[-1.0, -2.0]], np.float32),
                         logprob_teacher=np.array([[-np.inf, -1e9]], np.float32))
  np.testing.assert_allclose(np.asarray(a[0]), [-19.0, -18.0])


def test_no_gradient():
  f = lambda lt: opd.opd_advantages(response_mask=np.ones((2, T), bool),
                                    logprob_old=np.zeros((2, T), np.float32),
                                    logprob_teacher=lt).sum()
  assert np.all(np.asarray(jax.grad(f)(np.full((2, T), -1.0, np.float32))) == 0.0)


def test_outcome_without_reward_raises():
  z = np.zeros((B, T), np.float32)
  with pytest.raises(ValueError, match="outcome_coef"):
    opd.opd_advantages(response_mask=np.ones((B, T), bool), logprob_old=z,
                       logprob_teacher=z, outcome_coef=1.0)
  with pytest.raises(AssertionError):
    opd.opd_advantages(response_mask=np.ones((B, T), bool), logprob_old=z,
                       logprob_teacher=np.zeros((B, T + 1), np.float32))
