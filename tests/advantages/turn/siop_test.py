"""SIOP (credit/advantages/turn/siop.py)."""
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


# --------------------------------------------------------------------------
# Against transcriptions of the authors' code (dl-m9/SIOP,
# verl/utils/siop/siop_process_reward.py).
# --------------------------------------------------------------------------


def code_process_rewards(q, p_hats, lam=0.5, eps=1e-8):
  """`compute_siop_process_rewards` for multi-turn rows: p_hats[0] is τ_0, None = no finite
  entry; a turn gets 0 when its support or the previous one is None or r is not finite,
  then the last turn gets (1 − λ)q."""
  rews = []
  for t in range(1, len(p_hats)):
    p_t, p_prev = p_hats[t], p_hats[t - 1]
    if p_t is None or p_prev is None:
      rews.append(0.0)
      continue
    with np.errstate(all="ignore"):
      r = q * (np.log(p_t + eps) - np.log(p_prev + eps))
    rews.append(0.0 if not np.isfinite(r) else float(r))
  if rews:
    rews[-1] += (1.0 - lam) * q
  return rews


def test_final_bonus_survives_an_unscored_support():
  # Two turns, the first one's support unscored: the code gives [0, 0 + (1 − λ)q].
  q = np.array([0.386], np.float32)
  p = np.array([[0.3, np.nan, 0.5]], np.float32)
  want = code_process_rewards(0.386, [0.3, None, 0.5])
  np.testing.assert_allclose(want, [0.0, 0.193], atol=1e-6)
  r = np.asarray(siop.siop_turn_rewards(cluster_weight=q, support=p,
                                        step_mask=np.ones((1, 2), bool)))
  np.testing.assert_allclose(r, [want], atol=1e-6)


@pytest.mark.parametrize("seed", (0, 1, 2))
def test_turn_rewards_match_the_code_with_unscored_supports(seed):
  rng = np.random.default_rng(seed)
  Bn, K = 12, 4
  n_turns = rng.integers(2, K + 1, Bn)
  valid = np.arange(K)[None, :] < n_turns[:, None]
  q = rng.uniform(0, 1, Bn).astype(np.float32)
  p = rng.uniform(0.01, 1, (Bn, K + 1)).astype(np.float32)
  p[rng.uniform(size=(Bn, K + 1)) < 0.3] = np.nan        # unscored supports
  p[0, n_turns[0]] = np.nan                              # the last turn itself unscored
  r = np.asarray(siop.siop_turn_rewards(cluster_weight=q, support=p, step_mask=valid))
  for i in range(Bn):
    ph = [None if np.isnan(x) else float(x) for x in p[i, :n_turns[i] + 1]]
    np.testing.assert_allclose(r[i, :n_turns[i]], code_process_rewards(float(q[i]), ph),
                               rtol=1e-5, atol=1e-6, err_msg=f"row {i}")
    assert np.all(r[i, n_turns[i]:] == 0.0)


def test_gold_limit_skips_non_finite_log_probs_like_the_code():
  # One group of two 3-turn rows; the first row's turn-1 mean gold log-prob is -inf (the
  # code skips it: no support, gains 0 into and out of it).
  g_turns = np.array([[-1.0, -np.inf, -0.2], [-2.0, -1.5, -0.7]], np.float32)
  g_prompt = np.array([-1.2, -2.5], np.float32)
  step_mask = np.ones((2, 3), bool)
  turn_id = np.array([[0, 0, 1, 2], [0, 1, 1, 2]], np.int32)
  kw = dict(step_mask=step_mask, turn_id=turn_id, group_id=np.zeros(2, np.int32),
            response_mask=np.ones((2, 4), bool), num_groups=1)
  got = np.asarray(siop.siop_advantages(gold_logprob_turns=g_turns,
                                        gold_logprob_prompt=g_prompt, **kw))
  rews = []
  for i in range(2):
    ph = [None if not np.isfinite(x) else float(np.exp(x))
          for x in [g_prompt[i], *g_turns[i]]]
    rews.append(code_process_rewards(1.0, ph))
  np.testing.assert_allclose(rews[0][1:], [0.0, 0.5], atol=1e-7)  # 0 into/out of it, + bonus
  want = np.asarray(siop.siop_advantages_from_rewards(turn_rewards=np.array(rews, np.float32),
                                                      **kw))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def code_cluster_weights(cluster_id, group_id, evid_sum, evid_cnt, eta=1.0):
  """`siop_cluster_pass`'s frequencies and reliability calibration, row by row."""
  Bn = len(cluster_id)
  q = np.zeros(Bn)
  evidence = [evid_sum[i] / evid_cnt[i] if evid_cnt[i] > 0 else 0.0 for i in range(Bn)]
  for g in np.unique(group_id):
    rows = [i for i in range(Bn) if group_id[i] == g and cluster_id[i] >= 0]
    buckets = {}
    for i in rows:
      buckets.setdefault(int(cluster_id[i]), []).append(i)
    for idxs in buckets.values():
      for i in idxs:
        q[i] = len(idxs) / len(rows)
    if len(buckets) <= 1:
      continue
    logits = {}
    for c, idxs in buckets.items():
      evids = [evidence[i] for i in idxs if evid_cnt[i] > 0]
      r_c = float(np.mean(evids)) if evids else 0.0
      logits[c] = np.log(len(idxs) / len(rows) + 1e-12) + eta * r_c
    mx = max(logits.values())
    z = sum(np.exp(v - mx) for v in logits.values())
    for c, idxs in buckets.items():
      for i in idxs:
        q[i] = np.exp(logits[c] - mx) / z
  return q


@pytest.mark.parametrize("seed", (0, 1, 2, 3))
def test_cluster_weights_average_only_scored_rows_like_the_code(seed):
  rng = np.random.default_rng(seed)
  Bn, Gs = 16, 8
  gid = np.repeat(np.arange(Bn // Gs), Gs).astype(np.int32)
  cid = rng.integers(-1, 3, Bn).astype(np.int32)
  cnt = rng.integers(0, 3, Bn) * (rng.uniform(size=Bn) < 0.6)   # many rows unscored
  esum = rng.uniform(0, 1, Bn) * cnt
  ev = np.where(cnt > 0, esum / np.maximum(cnt, 1), 0.0).astype(np.float32)
  want = code_cluster_weights(cid, gid, esum, cnt)
  kw = dict(cluster_id=cid, evidence=ev, group_id=gid, num_groups=Bn // Gs, num_clusters=3)
  got = np.asarray(siop.siop_cluster_weights(**kw, evidence_mask=cnt > 0))
  np.testing.assert_allclose(got, want, atol=1e-5)
  # Default: evidence 0 marks a row without observations, as the code stores it.
  np.testing.assert_allclose(np.asarray(siop.siop_cluster_weights(**kw)), want, atol=1e-5)
  # Averaging over every answered row instead (the earlier behaviour) differs.
  every = np.asarray(siop.siop_cluster_weights(**kw, evidence_mask=np.ones(Bn, bool)))
  assert np.abs(every - want).max() > 1e-3
