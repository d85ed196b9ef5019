"""River behaviour-regularised GRPO (credit/advantages/turn/river.py); abstract only."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import river
from tests.advantages.turn._ref import pooled_keys, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("river").needs


def ref_river(b, behavior_coef=0.1):
  mask = b["response_mask"]
  row = mask.any(1)
  valid = b["step_mask"] & row[:, None]
  m = np.array([b["step_reward"][i][valid[i]].mean() if valid[i].any() else 0.0
                for i in range(len(row))])
  a = zscore_cells((b["reward"] + behavior_coef * m)[:, None], row[:, None],
                   pooled_keys(b["group_id"], 1), ddof=1)[:, 0]
  return np.where(mask, a[:, None], 0.0)


def test_registered():
  assert registry.get_estimator("river").confidence == "inferred"


def test_worked_example():
  # Equal outcomes [1, 1]; behaviour scores [[1, 1], [1, -1]] -> shaped [1.1, 1.0] -> ±0.707107
  # (σ = 0.0707, so eps = 1e-6 on σ shows in the 5th digit).
  a = river.river_advantages(reward=np.array([1., 1.], np.float32),
                             step_reward=np.array([[1., 1.], [1., -1.]], np.float32),
                             step_mask=np.ones((2, 2), bool), group_id=np.array([0, 0]),
                             response_mask=np.ones((2, 3), bool), num_groups=1)
  np.testing.assert_allclose(a, [[0.707107] * 3, [-0.707107] * 3], atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("coef", [0.1, 2.0])
def test_matches_numpy_reference(seed, coef):
  reward, lengths, gid = mixed_layout(seed)
  b = make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)
  got = river.river_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, behavior_coef=coef)
  np.testing.assert_allclose(got, ref_river(b, coef), atol=1e-4)
