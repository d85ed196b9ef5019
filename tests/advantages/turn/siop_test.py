"""SIOP (credit/advantages/turn/siop.py); spec token_and_implicit.md §6 + Corrections."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import siop
from tests.advantages.turn._ref import returns, scatter
from tests.advantages.turn.igpo_test import batch, np_layout
from tests.contract_fields import N


def np_siop_rewards(q, p, valid, lam=0.5, eps=1e-8):
  r = np.zeros(valid.shape)
  for i in range(valid.shape[0]):
    ks = np.nonzero(valid[i])[0]
    if len(ks) == 1:
      r[i, ks[0]] = (1 - lam) * q[i]
    elif len(ks) > 1:
      prev = p[i, 0]
      for k in ks:
        r[i, k] = q[i] * (np.log(p[i, k + 1] + eps) - np.log(prev + eps))
        prev = p[i, k + 1]
      r[i, ks[-1]] += (1 - lam) * q[i]
  return r


def np_siop_norm(r, valid, gid, eps=1e-6):
  out = np.zeros(r.shape)
  for g in np.unique(gid):
    cells = [(i, k) for i in np.nonzero(gid == g)[0] for k in range(r.shape[1]) if valid[i, k]]
    if len(cells) < 2:
      continue
    v = np.array([r[c] for c in cells])
    sd = v.std(ddof=1)
    sd = 1.0 if sd < eps else sd
    for c, x in zip(cells, v):
      out[c] = (x - v.mean()) / (sd + eps)
  return out


def ref_siop(b, lam=0.5, gamma=1.0):
  row, valid, last = np_layout(b)
  p = np.exp(np.concatenate([b["gold_logprob_prompt"][:, None], b["gold_logprob_turns"]], 1)
             .astype(np.float64))
  r = np_siop_rewards(row.astype(float), p, valid, lam)
  r_hat = np_siop_norm(r, valid, b["group_id"])
  return scatter(returns(r_hat, valid, gamma), b["turn_id"], b["response_mask"])


def test_spec_example():
  # Group of 3; clusters {0, 1} and {2}; e = [0.8, 0.1], η = 1 → q = [0.8011, 0.1989].
  q = np.asarray(siop.siop_cluster_weights(
      cluster_id=np.array([0, 0, 1], np.int32), evidence=np.array([0.9, 0.7, 0.1]),
      group_id=np.zeros(3, np.int32), num_groups=1, num_clusters=3))
  np.testing.assert_allclose(q, [0.8011, 0.8011, 0.1989], atol=1e-4)
  valid = np.array([[1, 1], [1, 1], [1, 0]], bool)
  p = np.array([[0.2, 0.4, 0.5], [0.2, 0.1, 0.3], [0.2, 0.9, 0.0]])
  r = np.asarray(siop.siop_turn_rewards(cluster_weight=q, support=p, step_mask=valid))
  np.testing.assert_allclose(r, [[0.5553, 0.5793], [-0.5553, 1.2806], [0.0995, 0.0]],
                             atol=1e-3)
  tid = np.array([[0, 1], [0, 1], [0, -1]], np.int32)
  a = np.asarray(siop.siop_advantages_from_rewards(
      turn_rewards=r, step_mask=valid, turn_id=tid, group_id=np.zeros(3, np.int32),
      response_mask=tid >= 0, num_groups=1))
  np.testing.assert_allclose(a, [[0.5181, 0.2768], [-0.0862, 1.3124], [-0.4318, 0.0]],
                             atol=1e-3)


def test_cluster_weight_edge_cases():
  # One cluster → q = m = 1; unanswered (−1) → 0 and not counted.
  q = np.asarray(siop.siop_cluster_weights(
      cluster_id=np.array([0, 0, -1, 0, 1], np.int32), evidence=np.zeros(5),
      group_id=np.array([0, 0, 0, 1, 1], np.int32), num_groups=2, num_clusters=2, eta=0.0))
  np.testing.assert_allclose(q, [1.0, 1.0, 0.0, 0.5, 0.5], atol=1e-6)


@pytest.mark.parametrize("seed", (0, 3))
def test_matches_numpy_reference(seed):
  b = batch(seed)
  spec = registry.get_estimator("siop")
  got = siop.siop_advantages(**{n: b[n] for n in spec.needs}, num_groups=N, lam=0.3)
  np.testing.assert_allclose(np.asarray(got), ref_siop(b, lam=0.3), rtol=1e-4, atol=1e-4)
