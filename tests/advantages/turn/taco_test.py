"""TACO DAPR + OGAR (credit/advantages/turn/taco.py); abstract only."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import taco
from tests.advantages.turn._ref import pooled_keys, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("taco").needs


def ref_taco(b, probe_coef=1.0):
  mask = b["response_mask"]
  row = mask.any(1)
  valid = b["step_mask"] & row[:, None]
  B, K = valid.shape
  a = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1),
                   ddof=1)[:, 0]
  turn = np.zeros((B, K))
  for i in range(B):
    ks = np.flatnonzero(valid[i])
    for k in ks:
      d = float(b["step_reward"][i, k])
      if k == ks[-1]:
        turn[i, k] = a[i]
      else:
        gate = d > 0 if a[i] > 0 else (d <= 0 if a[i] < 0 else False)
        turn[i, k] = (a[i] if gate else 0.0) + probe_coef * d
  out = np.zeros(mask.shape)
  for i in range(B):
    for t in range(mask.shape[1]):
      if mask[i, t]:
        k = b["turn_id"][i, t]
        out[i, t] = turn[i, k] if 0 <= k < K else a[i]
  return out


def test_registered():
  assert registry.get_estimator("taco").confidence == "inferred"


def test_worked_example():
  # Success (A = +0.707107): a useful call (d = 1) gets A + 1, a wasted one (d = 0) gets 0,
  # the answer turn A. Failure (A = -0.707107): a misleading call (d = -1) gets A - 1, a wasted
  # one A, the answer A.
  a = taco.taco_advantages(reward=np.array([1., 0.], np.float32),
                           step_reward=np.array([[1., 0., 0.], [-1., 0., 0.]], np.float32),
                           step_mask=np.ones((2, 3), bool), turn_id=np.array([[0, 1, 2]] * 2),
                           group_id=np.array([0, 0]), response_mask=np.ones((2, 3), bool),
                           num_groups=1)
  w = 0.707107
  np.testing.assert_allclose(a, [[w + 1, 0.0, w], [-w - 1, -w, -w]], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("coef", [1.0, 0.4])
def test_matches_numpy_reference(seed, coef):
  reward, lengths, gid = mixed_layout(seed)
  b = make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)
  b["step_reward"] = np.round(b["step_reward"])          # DAPR values in {-1, 0, 1}
  got = taco.taco_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, probe_coef=coef)
  np.testing.assert_allclose(got, ref_taco(b, coef), atol=1e-4)
