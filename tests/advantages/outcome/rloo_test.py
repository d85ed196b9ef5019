"""RLOO (credit/advantages/outcome/rloo.py)."""
from __future__ import annotations

import numpy as np

from credit.advantages.outcome import rloo_advantages
from tests.advantages.outcome._harness import (BASE, Case, ONE_GROUP, bt, reference_test, row0,
                                               valid_groups)


def ref_rloo(b, singleton="zero"):
  r = b["reward"].astype(np.float64)
  _, groups = valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    n = len(rows)
    if n == 1:
      out[rows] = r[rows] if singleton == "raw" else 0.0
    else:
      out[rows] = [r[i] - (r[rows].sum() - r[i]) / (n - 1) for i in rows]
  return (bt(out, b),)


CASES = [
    Case("rloo", "rloo", BASE, ref_rloo),
    Case("rloo_raw", "rloo", BASE, ref_rloo, (("singleton", "raw"),)),
]


test_matches_numpy_reference = reference_test(CASES)


def test_spec_example():
  # §3.6: R = [1, 0, 0, 1] -> a = ±2/3.
  a = rloo_advantages(reward=np.array([1., 0, 0, 1], np.float32), **ONE_GROUP)
  np.testing.assert_allclose(row0(a), [0.666667, -0.666667, -0.666667, 0.666667], atol=1e-5)
