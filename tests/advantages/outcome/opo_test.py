"""OPO (credit/advantages/outcome/opo.py)."""
from __future__ import annotations

import numpy as np

from credit.advantages.outcome import opo_advantages
from tests.advantages.outcome._harness import BASE, Case, bt, reference_test, valid_groups


def ref_opo(b, singleton="zero"):
  r = b["reward"].astype(np.float64)
  length = b["response_mask"].sum(1).astype(np.float64)
  _, groups = valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    if len(rows) == 1:
      out[rows] = r[rows] if singleton == "raw" else 0.0
    else:
      out[rows] = r[rows] - (length[rows] * r[rows]).sum() / length[rows].sum()
  return (bt(out, b),)


CASES = [
    Case("opo", "opo", BASE, ref_opo),
    Case("opo_raw", "opo", BASE, ref_opo, (("singleton", "raw"),)),
]


test_matches_numpy_reference = reference_test(CASES)


def test_hand_example():
  # Lengths 1 and 3, rewards 1 and 0 -> b = (1·1 + 3·0)/4 = 0.25.
  a = opo_advantages(reward=np.array([1., 0.], np.float32), group_id=np.zeros(2, np.int32),
                     response_mask=np.array([[1, 0, 0], [1, 1, 1]], bool), num_groups=1)
  np.testing.assert_allclose(np.asarray(a), [[0.75, 0, 0], [-0.25] * 3], atol=1e-6)
