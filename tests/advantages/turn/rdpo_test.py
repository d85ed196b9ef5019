"""IterSynth RDPO (credit/advantages/turn/rdpo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import rdpo
from tests.advantages.turn._ref import scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout


def batch(seed):
  reward, lengths, gid = mixed_layout(seed)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)


def ref_rdpo(b, beta=1.0, combine="reward", num_roles=2):
  valid = b["step_mask"] & b["response_mask"].any(1)[:, None]
  B, K = valid.shape
  keys = [[(int(b["group_id"][i]), int(b["turn_role"][i, k]))
           if 0 <= b["turn_role"][i, k] < num_roles else None for k in range(K)]
          for i in range(B)]
  R = np.repeat(b["reward"].astype(np.float64)[:, None], K, 1)
  u = b["step_reward"].astype(np.float64)
  if combine == "reward":
    a = zscore_cells(R + beta * u, valid, keys, ddof=1)
  else:
    a = zscore_cells(R, valid, keys, ddof=1) + beta * zscore_cells(u, valid, keys, ddof=1)
  return scatter(a, b["turn_id"], b["response_mask"])


def test_registered():
  assert registry.get_estimator("rdpo").confidence == "inferred"


def test_spec_example():
  # Row 0: planner turns r = 1.5, 0.5 and a synthesiser turn 1.0; row 1: planner 0.2, synth 0.
  # Outcome 0 for both rows so that r = rubric (β = 1).
  tid = np.array([[0, 1, 2], [0, 1, -1]])
  a = rdpo.rdpo_advantages(
      reward=np.zeros(2, np.float32),
      step_reward=np.array([[1.5, 0.5, 1.0], [0.2, 0.0, 0.0]], np.float32),
      step_mask=np.array([[True, True, True], [True, True, False]]),
      turn_role=np.array([[0, 0, 1], [0, 1, 0]]), turn_id=tid, group_id=np.array([0, 0]),
      response_mask=tid >= 0, num_groups=1)
  np.testing.assert_allclose(a, [[1.126313, -0.342791, 0.707106], [-0.783522, -0.707106, 0.0]],
                             atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("hyper", [{}, {"beta": 0.5, "combine": "advantage"}])
def test_matches_numpy_reference(seed, hyper):
  b = batch(seed)
  got = rdpo.rdpo_advantages(**{k: b[k] for k in registry.get_estimator("rdpo").needs},
                             num_groups=N, **hyper)
  np.testing.assert_allclose(got, ref_rdpo(b, **hyper), atol=1e-4)
