"""JOLT (credit/advantages/distill/jolt.py: `jolt` student role, `jolt_teacher` teacher
role)."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import jolt, opd
from tests.advantages.distill._harness import Case, reference_test
from tests.advantages.distill._ref_teach import (B, G, N, T, batch, pick, ref_jolt_teacher,
                                                 ref_opd, row_valid)

STUDENT = ("response_mask", "logprob_old", "logprob_teacher")
TEACHER = ("reward", "group_id", "response_mask", "logprob_old", "logprob_alt")




def ref_student(b, **kw):
  """The student role with a reward term is OPD's mixture (reward_coef = outcome_coef)."""
  return ref_opd(b, outcome_coef=kw["reward_coef"], group_size=kw.get("group_size"))


CASES = [Case(f"teacher{suffix}", jolt.jolt_teacher_advantages, TEACHER, ref_jolt_teacher, fast)
         for suffix, fast in (("", ()), ("_fast", (("group_size", G),)))]
CASES += [Case(f"student_reward{suffix}", jolt.jolt_advantages, STUDENT + ("reward", "group_id"),
               ref_student, fast + (("reward_coef", 0.3),))
          for suffix, fast in (("", ()), ("_fast", (("group_size", G),)))]
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  s, t = registry.get_estimator("jolt"), registry.get_estimator("jolt_teacher")
  assert s.family == t.family == "distill" and s.confidence == t.confidence == "inferred"
  assert s.needs == set(STUDENT) and t.needs == set(TEACHER)
  assert s.needs_for({"reward_coef": 0.5}) == set(STUDENT) | {"reward", "group_id"}


def test_doctests():
  res = doctest.testmod(jolt, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  # Student role: the A1 numbers.
  a = jolt.jolt_advantages(response_mask=np.ones((1, 3), bool),
                           logprob_old=np.array([[-0.5, -1.0, -2.0]], np.float32),
                           logprob_teacher=np.array([[-0.3, -1.5, -0.1]], np.float32))
  np.testing.assert_allclose(np.asarray(a[0]), [0.2, -0.5, 1.9], atol=1e-5)
  # Teacher role: rewards [1, 0], ℓ_T − ℓ_S = 0.4 on rollout 0, β = 0.05 → 0.687106.
  a = jolt.jolt_teacher_advantages(
      reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
      response_mask=np.ones((2, 1), bool), logprob_old=np.array([[-0.6], [-1.0]], np.float32),
      logprob_alt=np.array([[-1.0], [-1.0]], np.float32), num_groups=1)
  np.testing.assert_allclose(float(a[0, 0]), 0.707106 - 0.02, atol=1e-5)


def test_student_role_is_opd():
  b = batch(3)
  np.testing.assert_array_equal(np.asarray(jolt.jolt_advantages(**pick(b, *STUDENT))),
                                np.asarray(opd.opd_advantages(**pick(b, *STUDENT))))


def test_teacher_role_reductions():
  b = batch(4)
  grpo = np.asarray(grpo_advantages(**pick(b, "reward", "group_id", "response_mask"),
                                    num_groups=N))
  # β = 0, or roles that agree (ℓ_S|T = ℓ_T|T): plain GRPO.
  for kw in (dict(kl_coef=0.0), dict(logprob_alt=b["logprob_old"])):
    a = jolt.jolt_teacher_advantages(**dict(pick(b, *TEACHER), **kw), num_groups=N)
    np.testing.assert_allclose(np.asarray(a), grpo, rtol=1e-6, atol=1e-6)
  # A student role less likely on the token (ℓ_S|T < ℓ_T|T) lowers the advantage.
  a = jolt.jolt_teacher_advantages(**dict(pick(b, *TEACHER), logprob_alt=b["logprob_old"] - 1.0),
                                   num_groups=N)
  on = b["response_mask"] & row_valid(b)[:, None]
  np.testing.assert_allclose(np.asarray(a), np.where(on, grpo - 0.05, 0.0), rtol=1e-5,
                             atol=1e-6)


def test_bad_args_raise():
  z = np.zeros((B, T), np.float32)
  kw = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
            response_mask=np.ones((B, T), bool), logprob_old=z, logprob_alt=z, num_groups=N)
  with pytest.raises(ValueError, match="multiple"):
    jolt.jolt_teacher_advantages(**kw, group_size=5)
  with pytest.raises(ValueError, match="reward_coef"):
    jolt.jolt_advantages(response_mask=np.ones((B, T), bool), logprob_old=z,
                         logprob_teacher=z, reward_coef=0.5)
