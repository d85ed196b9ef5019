"""Dr.GRPO (credit/advantages/outcome/dr_grpo.py)."""
from __future__ import annotations

import numpy as np

from credit.advantages.outcome import dr_grpo_advantages
from tests.advantages.outcome._harness import (BASE, Case, ONE_GROUP, bt, grpo_rows, reference_test,
                                               row0)


def ref_dr_grpo(b, singleton="zero"):
  return (bt(grpo_rows(b, b["reward"].astype(np.float64), "none", 0.0, singleton), b),)


CASES = [
    Case("dr_grpo", "dr_grpo", BASE, ref_dr_grpo),
    Case("dr_grpo_raw", "dr_grpo", BASE, ref_dr_grpo, (("singleton", "raw"),)),
]


test_matches_numpy_reference = reference_test(CASES)


def test_spec_example():
  # §2.6: R = [1, 0, 0, 1] -> a = [0.5, −0.5, −0.5, 0.5].
  a = dr_grpo_advantages(reward=np.array([1., 0, 0, 1], np.float32), **ONE_GROUP)
  np.testing.assert_allclose(row0(a), [0.5, -0.5, -0.5, 0.5], atol=1e-6)
