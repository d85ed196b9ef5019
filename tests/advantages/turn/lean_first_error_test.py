"""Lean first-error credit (credit/advantages/turn/lean_first_error.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import lean_first_error as lfe
from tests.advantages.turn._ref import pooled_keys, scatter, zscore_cells
from tests.advantages.turn.igpo_test import batch, np_layout
from tests.contract_fields import N


def ref_lean(b, mode="first_token", coef=0.5):
  row, valid, _ = np_layout(b)
  q = np.zeros(valid.shape)
  for i in range(q.shape[0]):
    failed = False
    for k in range(q.shape[1]):
      if valid[i, k]:
        failed = failed or not b["step_reward"][i, k] > 0
        q[i, k] = -1.0 if failed else 1.0
  m, tid = b["response_mask"], b["turn_id"]
  q_bt = scatter(q, tid, m)
  if mode == "first_token":
    for i in range(m.shape[0]):
      seen = set()
      for t in range(m.shape[1]):
        if m[i, t] and tid[i, t] >= 0:
          if tid[i, t] in seen:
            q_bt[i, t] = 0.0
          seen.add(tid[i, t])
  a = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1), ddof=1)
  return np.where(m, a + coef * q_bt, 0.0)


def test_spec_example():
  # ok = [1, 1, 0, 1, 0] → f = 2, q = [1, 1, −1, −1, −1].
  q = lfe.first_error_rewards(np.array([[1, 1, 0, 1, 0]], bool), np.ones((1, 5), bool))
  np.testing.assert_array_equal(np.asarray(q), [[1, 1, -1, -1, -1]])
  tid = np.array([[0, 0, 1, 1, 2, 3, 4], [0, 1, 2, 3, 4, -1, -1]], np.int32)
  kw = dict(reward=np.array([1.0, 0.0]), step_reward=np.array([[1., 1, 0, 1, 0], [1] * 5]),
            step_mask=np.array([[1] * 5, [1] * 5], bool), turn_id=tid,
            group_id=np.zeros(2, np.int32), response_mask=tid >= 0, num_groups=1)
  a = np.asarray(lfe.lean_first_error_advantages(**kw))
  g = 0.707107
  np.testing.assert_allclose(a[0], g + 0.5 * np.array([1, 0, 1, 0, -1, -1, -1]), atol=1e-5)
  np.testing.assert_allclose(a[1, :5], -g + 0.5, atol=1e-5)
  a = np.asarray(lfe.lean_first_error_advantages(mode="propagate", **kw))
  np.testing.assert_allclose(a[0], g + 0.5 * np.array([1, 1, 1, 1, -1, -1, -1]), atol=1e-5)


@pytest.mark.parametrize("seed", (0, 3))
@pytest.mark.parametrize("kw", [{}, {"mode": "propagate", "coef": 0.2}])
def test_matches_numpy_reference(seed, kw):
  b = batch(seed)
  spec = registry.get_estimator("lean_first_error")
  got = lfe.lean_first_error_advantages(**{n: b[n] for n in spec.needs}, num_groups=N, **kw)
  np.testing.assert_allclose(np.asarray(got), ref_lean(b, **kw), rtol=1e-4, atol=1e-5)
