"""HyperGraphPro (credit/advantages/turn/hypergraphpro.py)."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import hypergraphpro as hg
from tests.advantages.turn._ref import pooled_keys, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("hypergraphpro").needs


def batch(seed):
  reward, lengths, gid = mixed_layout(seed)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)


def ref_hg(b, alpha=1.0, max_factor=2.0):
  row = b["response_mask"].any(1)
  valid = b["step_mask"] & row[:, None]
  a = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1),
                   ddof=1)[:, 0]
  B, K = valid.shape
  f = np.zeros((B, K))
  for i in range(B):
    ks = np.flatnonzero(valid[i])
    prev, d = 0.0, {}
    for k in ks:
      d[k] = b["turn_progress"][i, k] - prev
      prev = b["turn_progress"][i, k]
    m = np.mean(list(d.values())) if d else 0.0
    for k in ks:
      f[i, k] = np.clip(1 + alpha * (d[k] - m) * np.sign(a[i]), 0, max_factor)
  out = np.zeros(b["turn_id"].shape)
  for i in range(B):
    for t in range(out.shape[1]):
      if b["response_mask"][i, t]:
        k = b["turn_id"][i, t]
        out[i, t] = a[i] * (f[i, k] if 0 <= k < K else 1.0)
  return out


def test_registered_and_doctest():
  assert registry.get_estimator("hypergraphpro").confidence == "inferred"
  assert doctest.testmod(hg).failed == 0


def test_spec_example():
  # Δρ = [0.5, 0, 0.1] (progress 0.5, 0.5, 0.6): factor on success [1.3, 0.8, 0.9], on failure
  # [0.7, 1.2, 1.1] (with A = ±0.8: [1.04, 0.64, 0.72] and [-0.56, -0.96, -0.88]).
  a = hg.hypergraphpro_advantages(
      reward=np.array([1., 0.], np.float32), turn_progress=np.array([[.5, .5, .6]] * 2, np.float32),
      step_mask=np.ones((2, 3), bool), turn_id=np.array([[0, 1, 2]] * 2),
      group_id=np.array([0, 0]), response_mask=np.ones((2, 3), bool), num_groups=1)
  A = 0.70710678
  np.testing.assert_allclose(np.asarray(a) / A * 0.8, [[1.04, 0.64, 0.72], [-0.56, -0.96, -0.88]],
                             atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("hyper", [{}, {"alpha": 3.0, "max_factor": 1.5}])
def test_matches_numpy_reference(seed, hyper):
  b = batch(seed)
  got = hg.hypergraphpro_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, **hyper)
  np.testing.assert_allclose(got, ref_hg(b, **hyper), atol=1e-4)
