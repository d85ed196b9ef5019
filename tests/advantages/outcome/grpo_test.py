"""GRPO (credit/advantages/outcome/grpo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.outcome import grpo_advantages
from tests.advantages.outcome._harness import (BASE, Case, N, ONE_GROUP, bt, fixed_batch, grpo_rows,
                                               reference_test, row0)


def ref_grpo(b, scale="group", eps=1e-6, singleton="zero"):
  return (bt(grpo_rows(b, b["reward"].astype(np.float64), scale, eps, singleton), b),)


CASES = [
    Case("grpo", "grpo", BASE, ref_grpo),
    Case("grpo_batch", "grpo", BASE, ref_grpo, (("scale", "batch"),)),
    Case("grpo_none_raw", "grpo", BASE, ref_grpo, (("scale", "none"), ("singleton", "raw"))),
]


test_matches_numpy_reference = reference_test(CASES)


def test_spec_example():
  # §1.6: R = [1, 0, 0, 1], one group: μ = 0.5, σ = 0.577350.
  a = grpo_advantages(reward=np.array([1., 0, 0, 1], np.float32), **ONE_GROUP)
  np.testing.assert_allclose(row0(a), [0.866024, -0.866024, -0.866024, 0.866024], atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(scale="batchwise"), r"scale 'batchwise'.*Known: \['batch', 'group', 'none'\]"),
    (dict(singleton="drop"), r"singleton 'drop'.*Known: \['raw', 'zero'\]"),
    (dict(group_size=3), r"not a multiple of group_size=3"),
    (dict(num_groups=0), r"num_groups must be a Python int"),
    (dict(group_id=None), r"group_id is required on the segment path"),
])
def test_bad_static_args_raise(kwargs, match):
  b = fixed_batch()
  data = dict(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
              num_groups=N)
  with pytest.raises(ValueError, match=match):
    grpo_advantages(**dict(data, **kwargs))


def test_shape_mismatch_raises():
  b = fixed_batch()
  with pytest.raises(AssertionError):
    grpo_advantages(reward=b["reward"][:-1], group_id=b["group_id"],
                    response_mask=b["response_mask"], num_groups=N)
