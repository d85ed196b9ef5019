"""Clip / Delta PRM transforms (credit/advantages/shaping/prm_transform.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.shaping import prm_step_transform, prm_transform_advantages

B, K, T = 6, 3, 8


def test_spec_example():
  p, v = np.array([[0.9, 0.8, 0.3]], np.float32), np.ones((1, 3), bool)
  np.testing.assert_allclose(prm_step_transform(p, v, transform="delta"), [[0.1, 0.5, 0.3]],
                             atol=1e-5)
  np.testing.assert_allclose(prm_step_transform(p, v, transform="clip", eta=0.5),
                             [[0.0, 0.0, -0.2]], atol=1e-5)
  np.testing.assert_allclose(prm_step_transform(p, v, transform="clip_delta", eta=0.5),
                             [[0.0, 0.2, -0.2]], atol=1e-5)
  # A skipped step is jumped over: delta of [0.9, ·, 0.3] is [0.6, 0, 0.3].
  np.testing.assert_allclose(prm_step_transform(p, [[True, False, True]], transform="delta"),
                             [[0.6, 0.0, 0.3]], atol=1e-5)


def _batch(seed):
  rng = np.random.default_rng(seed)
  p = rng.uniform(0, 1, (B, K)).astype(np.float32)
  v = rng.random((B, K)) > 0.2
  lengths = rng.integers(0, T + 1, B)
  mask = np.arange(T)[None, :] < lengths[:, None]
  mask[1, 2] = False                                  # a hole inside a response
  sid = np.where(mask, np.minimum(np.arange(T) // 3, K - 1), -1).astype(np.int32)
  reward = rng.choice([0.0, 1.0], B).astype(np.float32)
  gid = (np.arange(B) % 2).astype(np.int32)
  return reward, p, v, sid, mask, gid


def ref_prm(reward, p, v, sid, mask, gid, transform, eta, alpha, baseline):
  x = np.zeros((B, T))
  for i in range(B):
    steps = [k for k in range(K) if v[i, k]]
    q = {k: float(p[i, k]) for k in steps}
    if transform in ("clip", "clip_delta"):
      q = {k: min(q[k] - eta, 0.0) for k in steps}
    if transform in ("delta", "clip_delta"):
      q = {k: q[k] - (q[steps[j + 1]] if j + 1 < len(steps) else 0.0)
           for j, k in enumerate(steps)}
    toks = np.flatnonzero(mask[i])
    for k in steps:
      ts = [t for t in toks if sid[i, t] == k]
      if ts:
        x[i, ts[-1]] += alpha * q[k]
    if len(toks):
      x[i, toks[-1]] += reward[i]
  g = np.zeros((B, T))
  for i in range(B):
    acc = 0.0
    for t in reversed(range(T)):
      if mask[i, t]:
        acc += x[i, t]
        g[i, t] = acc
  if baseline:
    valid = mask.any(1)
    g0 = np.array([g[i, np.flatnonzero(mask[i])[0]] if valid[i] else 0.0 for i in range(B)])
    for i in np.flatnonzero(valid):
      g[i] = np.where(mask[i], g[i] - g0[valid & (gid == gid[i])].mean(), 0.0)
  return g


@pytest.mark.parametrize("seed,transform,baseline", [(0, "clip_delta", False),
                                                     (1, "delta", True), (2, "clip", False),
                                                     (3, "none", True)])
def test_matches_numpy(seed, transform, baseline):
  reward, p, v, sid, mask, gid = _batch(seed)
  got = prm_transform_advantages(reward=reward, step_reward=p, step_mask=v, step_id=sid,
                                 response_mask=mask, group_id=gid, num_groups=2,
                                 transform=transform, eta=0.4, alpha=0.7,
                                 group_baseline=baseline)
  np.testing.assert_allclose(got, ref_prm(reward, p, v, sid, mask, gid, transform, 0.4, 0.7,
                                          baseline), atol=1e-5)


def test_delta_return_from_a_step_is_its_score():
  # Delta telescopes: the return at the first token of step s is α·p_s + R.
  reward, p, v, sid, mask, _ = _batch(4)
  v[:] = True
  mask[:] = True
  sid = np.minimum(np.arange(T) // 3, K - 1)[None].repeat(B, 0).astype(np.int32)
  got = np.asarray(prm_transform_advantages(reward=reward, step_reward=p, step_mask=v,
                                            step_id=sid, response_mask=mask,
                                            transform="delta"))
  np.testing.assert_allclose(got[:, [0, 3, 6]], p + reward[:, None], atol=1e-5)


def test_bad_arguments():
  reward, p, v, sid, mask, _ = _batch(0)
  kw = dict(reward=reward, step_reward=p, step_mask=v, step_id=sid, response_mask=mask)
  with pytest.raises(ValueError, match="transform"):
    prm_transform_advantages(**kw, transform="cut")
  with pytest.raises(ValueError, match="group_id"):
    prm_transform_advantages(**kw, group_baseline=True)
