"""ReMax (credit/advantages/outcome/remax.py)."""
from __future__ import annotations

import numpy as np

from credit.advantages.outcome import remax_advantages
from tests.advantages.outcome._harness import Case, bt, reference_test


def ref_remax(b):
  return (bt(b["reward"].astype(np.float64) - b["reward_baseline"], b),)


CASES = [Case("remax", "remax", ("reward", "reward_baseline", "response_mask"), ref_remax,
              group=False)]


test_matches_numpy_reference = reference_test(CASES)


def test_hand_example():
  a = remax_advantages(reward=np.array([1., 0.], np.float32),
                       reward_baseline=np.array([0.5, 0.5], np.float32),
                       response_mask=np.array([[1, 1], [1, 0]], bool))
  np.testing.assert_allclose(np.asarray(a), [[0.5, 0.5], [-0.5, 0]], atol=1e-7)
