"""ProCredit (credit/advantages/turn/procredit.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import procredit
from tests.advantages.turn._ref import pooled_keys, scatter, zscore_cells
from tests.advantages.turn.igpo_test import batch, np_layout, np_prev
from tests.contract_fields import N


def ref_procredit(b, turn_coef=1.0):
  row, valid, _ = np_layout(b)
  p = np.where(valid, b["turn_progress"], 0.0).astype(np.float64)
  u = np.where(valid, p - np_prev(p, valid, np.zeros(len(p))), 0.0)
  a_turn = zscore_cells(u, valid, pooled_keys(b["group_id"], valid.shape[1]), ddof=0)
  a_traj = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1),
                        ddof=1)[:, 0]
  m = b["response_mask"]
  return np.where(m, a_traj[:, None] + turn_coef * scatter(a_turn, b["turn_id"], m), 0.0)


def test_spec_example():
  tid = np.array([[0, 1, 2], [0, 1, 2]], np.int32)
  a = procredit.procredit_advantages(
      reward=np.array([1.0, 0.0]), turn_progress=np.array([[.25, .25, 1.], [.5, .5, .5]]),
      step_mask=np.ones((2, 3), bool), turn_id=tid, group_id=np.zeros(2, np.int32),
      response_mask=tid >= 0, num_groups=1)
  a_traj = np.array([0.707106, -0.707106])[:, None]
  a_turn = np.array([[0, -0.866022, 1.732045], [0.866022, -0.866022, -0.866022]])
  np.testing.assert_allclose(np.asarray(a), a_traj + a_turn, atol=1e-4)


@pytest.mark.parametrize("seed", (0, 3))
def test_matches_numpy_reference(seed):
  b = batch(seed)
  spec = registry.get_estimator("procredit")
  got = procredit.procredit_advantages(**{n: b[n] for n in spec.needs}, num_groups=N,
                                       turn_coef=0.5)
  np.testing.assert_allclose(np.asarray(got), ref_procredit(b, 0.5), rtol=1e-4, atol=1e-5)
