"""MAPO (credit/advantages/turn/mapo.py)."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import mapo
from tests.advantages.turn._ref import index_keys, returns, scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout


def batch(seed):
  reward, lengths, gid = mixed_layout(seed)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)


def ref_mapo(b, *, outcome_coef=0.0, gamma=1.0, lam=0.5):
  valid = b["step_mask"] & b["response_mask"].any(1)[:, None]
  x = np.where(valid, b["step_reward"], 0.0).astype(np.float64)
  if outcome_coef:
    for i in range(x.shape[0]):
      ks = np.flatnonzero(valid[i])
      if len(ks):
        x[i, ks[-1]] += outcome_coef * b["reward"][i]
  g = returns(x, valid, gamma)
  K = x.shape[1]
  turn = zscore_cells(g, valid, index_keys(b["group_id"], K), ddof=1)
  batch_ = zscore_cells(g, valid, [[0] * K] * x.shape[0], ddof=1)
  return scatter(lam * turn + (1 - lam) * batch_, b["turn_id"], b["response_mask"])


def test_registered():
  spec = registry.get_estimator("mapo")
  assert spec.family == "turn" and spec.confidence == "inferred"


def test_doctests():
  res = doctest.testmod(mapo)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  tid = np.array([[0, 1, 2], [0, 1, 2]])
  a = mapo.mapo_advantages(step_reward=np.array([[.2, .5, 1.], [.4, .1, 0.]], np.float32),
                           step_mask=np.ones((2, 3), bool), turn_id=tid,
                           group_id=np.array([0, 0]), response_mask=np.ones((2, 3), bool),
                           num_groups=1)
  np.testing.assert_allclose(a, [[0.982446, 0.842692, 0.493307],
                                 [-0.563184, -0.842692, -0.912569]], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("hyper", [{}, {"outcome_coef": 1.0, "gamma": 0.9, "lam": 0.3}])
def test_matches_numpy_reference(seed, hyper):
  b = batch(seed)
  got = mapo.mapo_advantages(step_reward=b["step_reward"], step_mask=b["step_mask"],
                             turn_id=b["turn_id"], group_id=b["group_id"],
                             response_mask=b["response_mask"], reward=b["reward"],
                             num_groups=N, **hyper)
  np.testing.assert_allclose(got, ref_mapo(b, **hyper), atol=1e-4)
