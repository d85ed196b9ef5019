"""DataPRM ternary process credit (credit/advantages/turn/dataprm.py); abstract only."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import dataprm
from tests.advantages.turn._ref import pooled_keys, scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("dataprm").needs


def ref_dataprm(b, process_coef=1.0):
  mask = b["response_mask"]
  row = mask.any(1)
  valid = b["step_mask"] & row[:, None]
  q = np.clip(b["step_reward"], -1, 1)
  out = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1),
                     ddof=1)[:, 0]
  p = zscore_cells(q, valid, pooled_keys(b["group_id"], q.shape[1]), ddof=1)
  return np.where(mask, out[:, None], 0.0) + process_coef * scatter(p, b["turn_id"], mask)


def test_registered():
  assert registry.get_estimator("dataprm").confidence == "inferred"


def test_worked_example():
  # Outcome [1, 0] -> ±0.707107. Labels [[1, 0], [0, -1]] (row 0: a correctable error then a
  # correct step): pool {1, 0, 0, -1}, μ = 0, σ = 0.816497 -> [[1.224745, 0], [0, -1.224745]].
  a = dataprm.dataprm_advantages(reward=np.array([1., 0.], np.float32),
                                 step_reward=np.array([[1., 0.], [0., -1.]], np.float32),
                                 step_mask=np.ones((2, 2), bool), turn_id=np.array([[0, 1]] * 2),
                                 group_id=np.array([0, 0]), response_mask=np.ones((2, 2), bool),
                                 num_groups=1)
  np.testing.assert_allclose(a, [[1.931852, 0.707107], [-0.707107, -1.931852]], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("coef", [1.0, 0.3])
def test_matches_numpy_reference(seed, coef):
  reward, lengths, gid = mixed_layout(seed)
  b = make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)
  b["step_reward"] = b["step_reward"] * 1.5          # some labels outside [-1, 1]: clipped
  got = dataprm.dataprm_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, process_coef=coef)
  np.testing.assert_allclose(got, ref_dataprm(b, coef), atol=1e-4)
