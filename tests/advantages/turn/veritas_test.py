"""VERITAS faithfulness turn credit (credit/advantages/turn/veritas.py); abstract only."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import veritas
from tests.advantages.turn._ref import pooled_keys, scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("veritas").needs


def ref_veritas(b, faith_coef=1.0):
  mask = b["response_mask"]
  valid = b["step_mask"] & mask.any(1)[:, None]
  r = b["reward"][:, None] + faith_coef * b["step_reward"]
  a = zscore_cells(r, valid, pooled_keys(b["group_id"], r.shape[1]), ddof=1)
  return scatter(a, b["turn_id"], mask)


def test_registered():
  assert registry.get_estimator("veritas").confidence == "inferred"


def test_worked_example():
  # Outcome [1, 0], faithfulness [[1, 0], [1, 0]] -> r = [[2, 1], [1, 0]], μ = 1,
  # σ = 0.816497 -> [[1.224745, 0], [0, -1.224745]].
  a = veritas.veritas_advantages(reward=np.array([1., 0.], np.float32),
                                 step_reward=np.array([[1., 0.], [1., 0.]], np.float32),
                                 step_mask=np.ones((2, 2), bool), turn_id=np.array([[0, 1]] * 2),
                                 group_id=np.array([0, 0]), response_mask=np.ones((2, 2), bool),
                                 num_groups=1)
  np.testing.assert_allclose(a, [[1.224745, 0.0], [0.0, -1.224745]], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("coef", [1.0, 0.2])
def test_matches_numpy_reference(seed, coef):
  reward, lengths, gid = mixed_layout(seed)
  b = make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)
  got = veritas.veritas_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, faith_coef=coef)
  np.testing.assert_allclose(got, ref_veritas(b, coef), atol=1e-4)
