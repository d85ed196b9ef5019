"""Dr.GRPO (credit/advantages/outcome/dr_grpo.py); spec outcome_and_clipping.md §2."""
from __future__ import annotations

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from credit.advantages.outcome import dr_grpo_advantages
from tests.advantages.outcome._harness import (BASE, ONE_GROUP, Case, batches, bt,
                                               check_paths_agree, check_reference, grpo_rows,
                                               row0)


def ref_dr_grpo(b, singleton="zero"):
  return (bt(grpo_rows(b, b["reward"].astype(np.float64), "none", 0.0, singleton), b),)


CASES = [
    Case("dr_grpo", "dr_grpo", BASE, ref_dr_grpo),
    Case("dr_grpo_raw", "dr_grpo", BASE, ref_dr_grpo, (("singleton", "raw"),)),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(case, data):
  check_reference(case, data)


@pytest.mark.parametrize("case", CASES, ids=str)
@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches(contiguous=True))
def test_segment_path_equals_fast_path(case, b):
  check_paths_agree(case, b)


def test_spec_example():
  # §2.6: R = [1, 0, 0, 1] -> a = [0.5, −0.5, −0.5, 0.5].
  a = dr_grpo_advantages(reward=np.array([1., 0, 0, 1], np.float32), **ONE_GROUP)
  np.testing.assert_allclose(row0(a), [0.5, -0.5, -0.5, 0.5], atol=1e-6)
