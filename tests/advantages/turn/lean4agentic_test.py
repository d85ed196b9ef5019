"""Lean4AgenticRL (credit/advantages/turn/lean4agentic.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import lean4agentic as l4
from tests.advantages.turn._ref import pooled_keys, scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("lean4agentic").needs


def batch(seed):
  reward, lengths, gid = mixed_layout(seed)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)


def ref_lean4(b, outcome_weight=1.0, stage_weight=1.0, num_stages=8):
  row = b["response_mask"].any(1)
  valid = b["step_mask"] & row[:, None]
  B, K = valid.shape
  out = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1),
                     ddof=1)[:, 0]
  keys = [[(int(b["group_id"][i]), int(b["turn_role"][i, k]))
           if 0 <= b["turn_role"][i, k] < num_stages else None for k in range(K)]
          for i in range(B)]
  st = zscore_cells(b["step_reward"], valid, keys, ddof=1)
  return (outcome_weight * np.where(b["response_mask"], out[:, None], 0.0)
          + stage_weight * scatter(st, b["turn_id"], b["response_mask"]))


def test_registered():
  assert registry.get_estimator("lean4agentic").confidence == "inferred"


def test_spec_example():
  # Stage rewards [[1,1],[1,0],[0,0]], outcome [1,0,0]: stage-1 token of row 0 gets 2.309398.
  tid = np.array([[0, 1]] * 3)
  a = l4.lean4agentic_advantages(
      reward=np.array([1., 0., 0.], np.float32),
      step_reward=np.array([[1., 1.], [1., 0.], [0., 0.]], np.float32),
      step_mask=np.ones((3, 2), bool), turn_role=np.array([[0, 1]] * 3), turn_id=tid,
      group_id=np.zeros(3, np.int32), response_mask=np.ones((3, 2), bool), num_groups=1)
  np.testing.assert_allclose(a[0, 1], 2.309398, atol=1e-5)
  np.testing.assert_allclose(a[:, 0], [1.732048, 0.0, -1.732048],
                             atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("hyper", [{}, {"outcome_weight": 0.5, "stage_weight": 2.0,
                                        "num_stages": 1}])
def test_matches_numpy_reference(seed, hyper):
  b = batch(seed)
  got = l4.lean4agentic_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, **hyper)
  np.testing.assert_allclose(got, ref_lean4(b, **hyper), atol=1e-4)
