"""DAPO (credit/advantages/outcome/dapo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.outcome import dapo_advantages, dapo_keep_mask, dapo_overlong_penalty
from tests.advantages.outcome._harness import BASE, Case, T, bt, grpo_rows, reference_test


def _overlong_np(length, max_length, cache, f):
  return np.clip(-(length - (max_length - cache)) / cache * f, -f, 0.0)


def ref_dapo(b, max_length=None, cache_length=4096, penalty_factor=1.0, eps=1e-6,
             singleton="zero"):
  r = b["reward"].astype(np.float64)
  if max_length is not None:
    r = r + _overlong_np(b["response_mask"].sum(1), max_length, cache_length, penalty_factor)
  return (bt(grpo_rows(b, r, "group", eps, singleton), b),)


CASES = [
    Case("dapo", "dapo", BASE, ref_dapo),
    Case("dapo_overlong", "dapo", BASE, ref_dapo,
         (("max_length", 5), ("cache_length", 3), ("penalty_factor", 0.5))),
]


test_matches_numpy_reference = reference_test(CASES)


def test_spec_overlong_penalty_and_keep_mask():
  # §7.6: lengths 16000, 18432, 20480 with L_max = 20480, L_cache = 4096, f = 1.
  pen = dapo_overlong_penalty(np.array([16000, 18432, 20480]), 20480, 4096, 1.0)
  np.testing.assert_allclose(np.asarray(pen), [0.0, -0.5, -1.0], atol=1e-7)
  # Groups [1, 1, 1, 1] -> dropped; [1, 0, 1, 0] -> kept; both group paths.
  metric = np.array([1., 1, 1, 1, 1, 0, 1, 0])
  keep = dapo_keep_mask(metric, np.array([0] * 4 + [1] * 4), num_groups=2)
  assert np.asarray(keep).tolist() == [False] * 4 + [True] * 4
  keep_fast = dapo_keep_mask(metric, None, 2, group_size=4)
  assert np.asarray(keep_fast).tolist() == np.asarray(keep).tolist()
  # A singleton group and rows outside `valid` are never kept.
  keep2 = dapo_keep_mask(np.array([1., 0, 1]), np.array([0, 0, 1]), 2,
                         valid=np.array([True, False, True]))
  assert np.asarray(keep2).tolist() == [False, False, False]


def test_overlong_shaping_changes_ranking():
  r = np.array([1., 1., 1., 1.], np.float32)
  m = np.arange(T)[None, :] < np.array([2, 3, 5, 6])[:, None]
  a = dapo_advantages(reward=r, group_id=np.zeros(4, np.int32), response_mask=m,
                      num_groups=1, max_length=6, cache_length=4)
  # Penalties [0, −0.25, −0.75, −1]: shorter answers get the positive advantage.
  assert np.all(np.diff(np.asarray(a)[:, 0]) < 0)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="cache_length"):
    dapo_overlong_penalty(np.array([1.0]), 10, 0)
  with pytest.raises(ValueError, match="exceeds"):
    dapo_overlong_penalty(np.array([1.0]), 10, 20)
  with pytest.raises(ValueError, match="group_id is required"):
    dapo_keep_mask(np.array([1., 0]), None, 1)
