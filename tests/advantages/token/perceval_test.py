"""Tests for the Perceval estimator (credit/advantages/token/perceval.py).

Code-verified against RUCAIBox/Perceval `compute_TRM_outcome_advantage`. The numpy
reference is written from the formula.
Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest

import hypothesis
import numpy as np
import pytest

from credit import registry
from credit.advantages.token import perceval as pc
from tests.advantages.token._harness import (assert_reduces_to_grpo, assert_sign_kept, grpo_of,
                                             reference_test, table)
from tests.advantages.token._ref import N, G, T, B, batches, pick, ref_grpo

FIELDS = ("reward", "group_id", "response_mask", "flag_mask")
CONFIGS = {
    "default": dict(),
    "raw_population": dict(singleton="raw", group_std="population", penalty=0.3),
    "nostd_fast": dict(group_std="none", group_size=G, penalty=1.0),
}


def ref_perceval(b, *, group_size=None, penalty=0.1, group_std="unbiased", singleton="zero"):
  mask = b["response_mask"]
  adv = ref_grpo(b["reward"], b["group_id"], mask, group_size=group_size, group_std=group_std,
                 singleton=singleton)
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      if mask[i, t]:
        out[i, t] = adv[i] - penalty * abs(adv[i]) * float(b["flag_mask"][i, t])
  return out


CASES = table(pc.perceval_advantages, FIELDS, ref_perceval, CONFIGS)
test_matches_numpy_reference = reference_test(CASES, max_examples=12)


def test_registered_in_token_family():
  spec = registry.get_estimator("perceval")
  assert spec.family == "token" and spec.confidence == "code-verified"
  assert spec.needs == set(FIELDS)
  assert "http" in spec.paper


def test_doctests():
  res = doctest.testmod(pc, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  flags = np.zeros((4, 4), bool)
  flags[0, 1] = flags[0, 2] = flags[1, 3] = True
  a = np.asarray(pc.perceval_advantages(
      reward=np.array([1.0, 0.0, 1.0, 0.0]), group_id=np.zeros(4, np.int32),
      response_mask=np.ones((4, 4), bool), flag_mask=flags, num_groups=1))
  np.testing.assert_allclose(a[0], [0.8660, 0.7794, 0.7794, 0.8660], atol=1e-3)
  np.testing.assert_allclose(a[1], [-0.8660, -0.8660, -0.8660, -0.9526], atol=1e-3)
  np.testing.assert_allclose(a[2:], np.array([[0.8660] * 4, [-0.8660] * 4]), atol=1e-3)


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_reductions_and_sign(b):
  grpo = grpo_of(b)
  kw = pick(b, *FIELDS)
  assert_reduces_to_grpo([pc.perceval_advantages(num_groups=N, **dict(kw, **alt))
                          for alt in (dict(penalty=0.0), dict(flag_mask=np.zeros((B, T), bool)))],
                         grpo, rtol=1e-6, atol=1e-7)
  a = np.asarray(pc.perceval_advantages(num_groups=N, **kw))
  assert_sign_kept(a, grpo)
  # Flagged tokens never gain: A ≤ Â everywhere, strictly below where flagged and Â ≠ 0.
  assert np.all(a <= grpo + 1e-7)
  hit = b["flag_mask"] & b["response_mask"] & (grpo != 0)
  assert np.all(a[hit] < grpo[hit])


def test_singleton_raw_is_the_code_convention():
  kw = dict(reward=np.array([0.7, 1.0, 0.0], np.float32), group_id=np.array([0, 1, 1], np.int32),
            response_mask=np.ones((3, 2), bool), flag_mask=np.array([[0, 1]] * 3, bool),
            num_groups=2)
  zero = np.asarray(pc.perceval_advantages(**kw))
  raw = np.asarray(pc.perceval_advantages(singleton="raw", **kw))
  assert np.all(zero[0] == 0)
  np.testing.assert_allclose(raw[0], [0.7, 0.7 - 0.07], rtol=1e-6)
  np.testing.assert_allclose(raw[1:], zero[1:])


@pytest.mark.parametrize("kwargs,match", [
    (dict(group_std="sample"), "group_std"),
    (dict(singleton="one"), "singleton"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), flag_mask=np.zeros((B, T), bool),
              num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    pc.perceval_advantages(**base)


def test_shape_mismatch_raises():
  with pytest.raises(AssertionError):
    pc.perceval_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                           response_mask=np.ones((B, T), bool),
                           flag_mask=np.zeros((B, T + 1), bool), num_groups=N)
