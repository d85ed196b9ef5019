"""PPR ReNorm (credit/advantages/shaping/ppr_renorm.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.shaping import ppr_renorm_advantages

N, G, K, T = 2, 4, 3, 7
B = N * G


def _batch(seed):
  rng = np.random.default_rng(seed)
  p = rng.uniform(0, 1, (B, K)).astype(np.float32)
  v = rng.random((B, K)) > 0.25
  v[3] = False                                        # a row without steps: outcome fallback
  lengths = rng.integers(1, T + 1, B)
  lengths[6] = 0
  mask = np.arange(T)[None, :] < lengths[:, None]
  sid = np.where(mask, np.minimum(np.arange(T) // 2, K - 1), -1).astype(np.int32)
  sid[:, 0] = np.where(mask[:, 0], -1, sid[:, 0])     # a token outside every step
  o = rng.choice([0.0, 1.0], B).astype(np.float32)
  gid = rng.permutation(np.arange(B) // G).astype(np.int32)
  return p, v, o, sid, gid, mask


def ref_ppr(p, v, o, sid, gid, mask, step_returns):
  valid = mask.any(1)
  has_tok = np.array([[np.any(mask[i] & (sid[i] == k)) for k in range(K)] for i in range(B)])
  cells = v & has_tok & valid[:, None]
  a = np.zeros((B, K))
  for g in range(N):
    vals = [(i, k, p[i, k] + o[i] - 1.0) for i in range(B) for k in range(K)
            if cells[i, k] and gid[i] == g]
    if len(vals) < 2:
      continue
    x = np.array([r for _, _, r in vals], np.float64)
    for (i, k, r) in vals:
      a[i, k] = (r - x.mean()) / (x.std(ddof=1) + 1e-6)
  if step_returns:
    for i in range(B):
      acc = 0.0
      for k in reversed(range(K)):
        if cells[i, k]:
          acc += a[i, k]
          a[i, k] = acc
  out = np.zeros((B, T))
  for i in range(B):
    if not valid[i]:
      continue
    if not cells[i].any():
      r = o[valid & (gid == gid[i])]
      z = (o[i] - r.mean()) / (r.std(ddof=1) + 1e-6) if len(r) > 1 else 0.0
      out[i] = np.where(mask[i], z, 0.0)
      continue
    for t in range(T):
      if mask[i, t] and 0 <= sid[i, t] < K:
        out[i, t] = a[i, sid[i, t]]
  return out


def test_spec_example():
  # p = [0.8, 0.6] with o = 1 -> r~ = [0.8, 0.6]; with o = 0 -> [-0.2, -0.4]; one group,
  # z-scored over the four steps (mean 0.2, unbiased std).
  r = np.array([0.8, 0.6, -0.2, -0.4])
  z = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
  sid = np.array([[0, 0, 1, 1]] * 2, np.int32)
  got = ppr_renorm_advantages(step_reward=np.array([[0.8, 0.6]] * 2, np.float32),
                              step_mask=np.ones((2, 2), bool),
                              reward=np.array([1.0, 0.0], np.float32), step_id=sid,
                              group_id=np.zeros(2, np.int32),
                              response_mask=np.ones((2, 4), bool), num_groups=1)
  np.testing.assert_allclose(got, np.repeat(z.reshape(2, 2), 2, axis=1), atol=1e-5)


@pytest.mark.parametrize("seed,step_returns", [(0, False), (1, True), (2, False)])
def test_matches_numpy(seed, step_returns):
  p, v, o, sid, gid, mask = _batch(seed)
  got = ppr_renorm_advantages(step_reward=p, step_mask=v, reward=o, step_id=sid, group_id=gid,
                              response_mask=mask, num_groups=N, step_returns=step_returns)
  np.testing.assert_allclose(got, ref_ppr(p, v, o, sid, gid, mask, step_returns), atol=1e-5)


def test_failed_steps_never_net_positive_before_normalisation_and_bad_args():
  # With o = 0 every r~ = p - 1 <= 0; a group of failed rows only is still centred.
  p, v, o, sid, gid, mask = _batch(3)
  with pytest.raises(ValueError, match="singleton"):
    ppr_renorm_advantages(step_reward=p, step_mask=v, reward=o, step_id=sid, group_id=gid,
                          response_mask=mask, num_groups=N, singleton="all")
  with pytest.raises(ValueError, match="num_groups"):
    ppr_renorm_advantages(step_reward=p, step_mask=v, reward=o, step_id=sid, group_id=gid,
                          response_mask=mask, num_groups=0)
