"""SPD-RAG role credit (credit/advantages/turn/spd_rag.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import spd_rag
from tests.advantages.turn._ref import scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("spd_rag").needs


def ref_spd(b, num_roles=3, token_budget=512.0, budget_coef=0.1):
  mask = b["response_mask"]
  valid = b["step_mask"] & mask.any(1)[:, None]
  B, K = valid.shape
  L = np.zeros((B, K))
  for i in range(B):
    for t in range(mask.shape[1]):
      if mask[i, t] and 0 <= b["turn_id"][i, t] < K:
        L[i, b["turn_id"][i, t]] += 1
  r = b["reward"][:, None] - budget_coef * np.maximum(L - token_budget, 0) / token_budget
  keys = [[(int(b["group_id"][i]), int(b["turn_role"][i, k]))
           if 0 <= b["turn_role"][i, k] < num_roles else None for k in range(K)]
          for i in range(B)]
  return scatter(zscore_cells(r, valid, keys, ddof=1), b["turn_id"], mask)


def test_registered():
  assert registry.get_estimator("spd_rag").confidence == "inferred"


def test_worked_example():
  # Two trajectories, each a document-agent call (role 1) and a synthesis call (role 2).
  # Budget 2 tokens, c = 1: row 0's 3-token doc call is penalised by (3-2)/2 = 0.5, so the doc
  # pool is {1 - 0.5, 0} and the synthesis pool {1, 0}: both ±0.707107.
  tid = np.array([[0, 0, 0, 1], [0, 1, 1, -1]])
  a = spd_rag.spd_rag_advantages(reward=np.array([1., 0.], np.float32),
                                 step_mask=np.ones((2, 2), bool),
                                 turn_role=np.array([[1, 2], [1, 2]]), turn_id=tid,
                                 group_id=np.array([0, 0]), response_mask=tid >= 0,
                                 num_groups=1, token_budget=2.0, budget_coef=1.0)
  w = 0.707107
  np.testing.assert_allclose(a, [[w, w, w, w], [-w, -w, -w, 0.0]], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("hyper", [{}, {"token_budget": 1.0, "budget_coef": 0.7,
                                        "num_roles": 2}])
def test_matches_numpy_reference(seed, hyper):
  reward, lengths, gid = mixed_layout(seed)
  b = make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)
  got = spd_rag.spd_rag_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, **hyper)
  np.testing.assert_allclose(got, ref_spd(b, **hyper), atol=1e-4)
