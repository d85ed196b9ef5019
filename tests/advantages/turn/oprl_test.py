"""OPRL / iStar (credit/advantages/turn/oprl.py)."""
from __future__ import annotations

import doctest

import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import oprl
from tests.advantages.turn._ref import pooled_keys, scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("oprl").needs


def batch(seed):
  reward, lengths, gid = mixed_layout(seed)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)


def ref_oprl(b, beta=0.05, step_coef=1.0):
  mask = b["response_mask"]
  row = mask.any(1)
  valid = b["step_mask"] & row[:, None]
  B, K = valid.shape
  r = np.zeros((B, K))
  for i in range(B):
    for t in range(mask.shape[1]):
      k = b["turn_id"][i, t]
      if mask[i, t] and 0 <= k < K:
        r[i, k] += beta * (float(b["logprob_prm"][i, t]) - float(b["logprob_old"][i, t]))
  s = zscore_cells(r, valid, pooled_keys(b["group_id"], K), ddof=0)
  e = zscore_cells(b["reward"][:, None], row[:, None], pooled_keys(b["group_id"], 1),
                   ddof=0)[:, 0]
  return np.where(mask, e[:, None], 0.0) + step_coef * scatter(s, b["turn_id"], mask)


def test_registered_and_doctest():
  assert registry.get_estimator("oprl").confidence == "inferred"
  assert doctest.testmod(oprl).failed == 0


def test_spec_example():
  lp = np.array([[2., -1.], [.5, 1.5]], np.float32)
  kw = dict(logprob_prm=lp, logprob_old=np.zeros((2, 2), np.float32),
            response_mask=np.ones((2, 2), bool))
  a = oprl.oprl_advantages(**kw, reward=np.array([1., 0.], np.float32),
                           step_mask=np.ones((2, 2), bool), turn_id=np.array([[0, 1]] * 2),
                           group_id=np.array([0, 0]), num_groups=1)
  np.testing.assert_allclose(a, [[2.0911, -0.5275], [-1.2182, -0.3454]], atol=1e-3)
  loss = oprl.oprl_prm_loss(**kw, pairs=np.array([[0, 1]]))
  np.testing.assert_allclose(loss, 0.71846, atol=1e-5)
  g = jax.grad(lambda x: oprl.oprl_prm_loss(**dict(kw, logprob_prm=x), pairs=np.array([[0, 1]]),
                                            pair_mask=np.array([False])))(lp)
  assert np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("hyper", [{}, {"beta": 1.0, "step_coef": 0.5}])
def test_matches_numpy_reference(seed, hyper):
  b = batch(seed)
  got = oprl.oprl_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, **hyper)
  np.testing.assert_allclose(got, ref_oprl(b, **hyper), atol=1e-4)
