"""OREAL estimator and pair filter (credit/advantages/shaping/oreal.py)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from credit.advantages.shaping import oreal_advantages, oreal_pair_filter, oreal_token_weights

N, G, T = 3, 4, 5
B = N * G


def _batch(seed):
  rng = np.random.default_rng(seed)
  reward = rng.choice([1.0, -1.0], B).astype(np.float32)
  reward[:G] = 1.0                                     # an all-positive group
  lengths = rng.integers(0, T + 1, B)
  mask = np.arange(T)[None, :] < lengths[:, None]
  gid = rng.permutation(np.arange(B) // G).astype(np.int32)
  z = rng.normal(0, 2, (B, T)).astype(np.float32)
  return reward, mask, gid, z


def ref_oreal(reward, mask, gid, z, mode="rloo", tau=0.5):
  out = np.zeros(mask.shape)
  valid = mask.any(1)
  for i in range(B):
    if not valid[i]:
      continue
    mates = [j for j in range(B) if valid[j] and gid[j] == gid[i]]
    n = len(mates)
    if n < 2:
      continue
    r = np.array([reward[j] for j in mates], np.float64)
    if mode == "rloo":
      a = reward[i] - (r.sum() - reward[i]) / (n - 1)
    else:
      a = (reward[i] - r.mean()) / (r.std(ddof=1) + 1e-8)
    s, k = 0.0, 0
    for t in range(T):
      if not mask[i, t]:
        continue
      s, k = s + z[i, t], k + 1
      c = 1 / (1 + np.exp(-s / k))
      w = (c - tau) / (1 - tau) if reward[i] > 0 else ((1 - c) - tau) / (1 - tau)
      out[i, t] = a * min(max(w, 0.0), 1.0)
  return out


def test_spec_example():
  ones = dict(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 3), bool),
              num_groups=1)
  a = oreal_advantages(reward=np.array([1., -1, -1, 1], np.float32), **ones)
  np.testing.assert_allclose(a[:, 0], [1.333333, -1.333333, -1.333333, 1.333333], atol=1e-5)
  # Running-mean probabilities c = [0.9, 0.6, 0.3] -> w+ = [0.8, 0.2, 0], w- = [0, 0, 0.4].
  lg = np.log(np.array([0.9, 0.6, 0.3]) / np.array([0.1, 0.4, 0.7]))
  z = np.array([[lg[0], 2 * lg[1] - lg[0], 3 * lg[2] - 2 * lg[1]]], np.float32)
  wp, wn = oreal_token_weights(z, np.ones((1, 3), bool))
  np.testing.assert_allclose(wp, [[0.8, 0.2, 0.0]], atol=1e-5)
  np.testing.assert_allclose(wn, [[0.0, 0.0, 0.4]], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", ["rloo", "grpo"])
def test_matches_numpy(seed, mode):
  reward, mask, gid, z = _batch(seed)
  got = oreal_advantages(reward=reward, group_id=gid, response_mask=mask, num_groups=N,
                         token_rm_logit=z, mode=mode)
  np.testing.assert_allclose(got, ref_oreal(reward, mask, gid, z, mode), atol=1e-5)
  # {1, 0} rewards give the same advantages (shift invariance, split at R > 0).
  got01 = oreal_advantages(reward=(reward > 0).astype(np.float32) * 2 - 1, group_id=gid,
                           response_mask=mask, num_groups=N, token_rm_logit=z, mode="rloo")
  got10 = oreal_advantages(reward=(reward > 0).astype(np.float32), group_id=gid,
                           response_mask=mask, num_groups=N, token_rm_logit=z, mode="rloo")
  np.testing.assert_allclose(got10 * 2, got01, atol=1e-5)


def test_pair_filter_keeps_one_correct_one_incorrect_of_mixed_groups():
  reward, mask, gid, _ = _batch(2)
  mask[:, 0] = True
  reward[gid == 1] = -1.0                               # an all-negative group
  reward[np.flatnonzero(gid == 2)[:2]] = [1.0, -1.0]    # group 2 mixed
  keeps = [np.asarray(oreal_pair_filter(reward=reward, group_id=gid, response_mask=mask,
                                        key=jax.random.key(s), num_groups=N))
           for s in range(4)]
  for keep in keeps:
    for g in range(N):
      kept = keep & (gid == g)
      mixed = (reward[gid == g] > 0).any() and (reward[gid == g] <= 0).any()
      assert kept.sum() == (2 if mixed else 0)
      if mixed:
        assert sorted(reward[kept]) == [-1.0, 1.0]
  assert len({k.tobytes() for k in keeps}) > 1          # the choice is random


def test_bad_arguments():
  reward, mask, gid, _ = _batch(0)
  kw = dict(reward=reward, group_id=gid, response_mask=mask, num_groups=N)
  with pytest.raises(ValueError, match="mode"):
    oreal_advantages(**kw, mode="ppo")
  with pytest.raises(ValueError, match="token_rm_logit"):
    oreal_advantages(**kw, use_token_rm=True)


def test_pair_filter_applies_after_the_advantages_as_in_the_code():
  # OREAL's code (train_oreal.py, then trajectory.py): RLOO on all k rows of a prompt,
  # then one correct and one incorrect row are kept with the advantages they were given.
  reward = np.array([1, -1, -1, -1, 1, 1, -1, 1], np.float32)
  gid = np.repeat(np.arange(2), 4).astype(np.int32)
  mask = np.ones((8, 3), bool)
  kw = dict(group_id=gid, num_groups=2)
  keep = np.asarray(oreal_pair_filter(reward=reward, response_mask=mask,
                                      key=jax.random.key(0), **kw))
  # The code's order, transcribed: per group, a_i = r_i − (Σr − r_i)/(k − 1), then select.
  r = reward.reshape(2, 4).astype(np.float64)
  code_adv = (r - (r.sum(1, keepdims=True) - r) / 3).reshape(-1)
  want = np.where(keep[:, None] & mask, code_adv[:, None], 0.0)
  ours = np.asarray(oreal_advantages(reward=reward, response_mask=mask, **kw))
  np.testing.assert_allclose(np.where(keep[:, None], ours, 0.0), want, atol=1e-6)
  # Group 0 (+1, −1, −1, −1): the kept incorrect row has −2/3 in the code's order ...
  np.testing.assert_allclose(want[keep & (gid == 0) & (reward < 0), 0], [-2 / 3], atol=1e-6)
  # ... and −2 when the filter runs first (the pair alone forms the group).
  first = np.asarray(oreal_advantages(reward=reward, response_mask=mask & keep[:, None], **kw))
  np.testing.assert_allclose(first[keep & (gid == 0) & (reward < 0), 0], [-2.0], atol=1e-6)
  assert np.abs(first - want).max() > 1.0
