"""SCOUT UPS-GRPO (credit/advantages/turn/scout.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import scout
from tests.advantages.turn._ref import index_keys, pooled_keys, scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("scout").needs


def batch(seed):
  reward, lengths, gid = mixed_layout(seed)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)


def ref_scout(b, beta=1.0):
  row = b["response_mask"].any(1)
  valid = b["step_mask"] & row[:, None]
  out = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1),
                     ddof=1)[:, 0]
  tz = zscore_cells(b["step_reward"], valid, index_keys(b["group_id"], valid.shape[1]), ddof=1)
  return (np.where(b["response_mask"], out[:, None], 0.0)
          + beta * scatter(tz, b["turn_id"], b["response_mask"]))


def test_registered():
  assert registry.get_estimator("scout").confidence == "inferred"


def test_spec_example():
  # o = [1, 0], alignment of turn 0 = [0.6, 0.2], β = 1 -> ±1.414212 on turn 0.
  a = scout.scout_advantages(reward=np.array([1., 0.], np.float32),
                             step_reward=np.array([[.6], [.2]], np.float32),
                             step_mask=np.ones((2, 1), bool), turn_id=np.zeros((2, 2), np.int32),
                             group_id=np.array([0, 0]), response_mask=np.ones((2, 2), bool),
                             num_groups=1)
  np.testing.assert_allclose(a, [[1.414212] * 2, [-1.414212] * 2], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_matches_numpy_reference(seed, beta):
  b = batch(seed)
  got = scout.scout_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, beta=beta)
  np.testing.assert_allclose(got, ref_scout(b, beta), atol=1e-4)


def test_priorities():
  ent = np.array([[1., 2., 3., 4., 5., 6.], [0.5, 0.5, 9., 9., 0., 0.]], np.float32)
  tid = np.array([[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, -1, -1]])
  mask = tid >= 0
  p = scout.scout_priorities(entropy=ent, turn_id=tid, step_mask=np.array([[1, 1, 1], [1, 1, 0]],
                                                                          bool),
                             response_mask=mask, num_branch=3)
  # State after turn k is scored by the next turn's mean entropy.
  np.testing.assert_allclose(p.priority, [[3.5, 5.5, -np.inf], [9.0, -np.inf, -np.inf]])
  assert p.index.tolist() == [3, 1, 0] and p.valid.tolist() == [True, True, True]
  q = scout.scout_priorities(entropy=ent, turn_id=tid, step_mask=np.ones((2, 3), bool),
                             response_mask=np.zeros_like(mask), num_branch=2)
  assert not q.valid.any()
