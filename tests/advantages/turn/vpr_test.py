"""VPR (credit/advantages/turn/vpr.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import vpr
from tests.advantages.turn._ref import index_keys, pooled_keys, returns, scatter, zscore_cells
from tests.advantages.turn.igpo_test import batch, np_layout
from tests.contract_fields import N


def ref_vpr(b, gamma=1.0, reliability=1.0, turn_norm="index"):
  row, valid, last = np_layout(b)
  x = np.where(valid, reliability * b["step_reward"], 0.0) + np.where(
      last, b["reward"][:, None], 0.0)
  g = returns(x, valid, gamma)
  keys = (index_keys if turn_norm == "index" else pooled_keys)(b["group_id"], valid.shape[1])
  return scatter(zscore_cells(g, valid, keys, ddof=0), b["turn_id"], b["response_mask"])


def test_spec_example_returns():
  # v = [1, 0, 1], R = 1, γ = 1 → G = [3, 2, 2]; a second rollout with G = [0, 0, 0].
  tid = np.array([[0, 1, 2]] * 2, np.int32)
  a = vpr.vpr_advantages(
      reward=np.array([1.0, 0.0]), step_reward=np.array([[1., 0, 1], [0, 0, 0]]),
      step_mask=np.ones((2, 3), bool), turn_id=tid, group_id=np.zeros(2, np.int32),
      response_mask=tid >= 0, num_groups=1, turn_norm="pooled")
  g = np.array([3., 2, 2, 0, 0, 0])
  want = ((g - g.mean()) / (g.std() + 1e-6)).reshape(2, 3)
  np.testing.assert_allclose(np.asarray(a), want, atol=1e-5)


@pytest.mark.parametrize("seed", (0, 3))
@pytest.mark.parametrize("kw", [{}, {"gamma": 0.8, "reliability": 0.5, "turn_norm": "pooled"}])
def test_matches_numpy_reference(seed, kw):
  b = batch(seed)
  spec = registry.get_estimator("vpr")
  got = vpr.vpr_advantages(**{n: b[n] for n in spec.needs}, num_groups=N, **kw)
  np.testing.assert_allclose(np.asarray(got), ref_vpr(b, **kw), rtol=1e-4, atol=1e-5)
