"""RL Tango generator advantage and class-balance weights
(credit/advantages/shaping/rl_tango.py)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from credit.advantages.shaping import (class_balance_init, class_balance_weights,
                                       rl_tango_advantages, rl_tango_alpha)

N, G, K, T = 2, 4, 3, 7
B = N * G


def test_spec_examples():
  sid = np.array([[0, 0, 1, 1]] * 2, np.int32)
  kw = dict(reward=np.array([1.0, 0.0], np.float32), step_reward=np.array(
      [[0.5, -0.5], [0.5, 0.5]], np.float32), step_mask=np.ones((2, 2), bool), step_id=sid,
      group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
  proc = rl_tango_advantages(**kw, schedule="fixed", outcome_weight=0.0)
  np.testing.assert_allclose(proc, [[-1, -1, -1.5, -1.5], [1, 1, 0.5, 0.5]], atol=1e-5)
  np.testing.assert_allclose(rl_tango_alpha(50.0, alpha0=0.5, alpha_min=1e-3,
                                            total_steps=100.0), 0.022361, atol=1e-5)
  out = rl_tango_advantages(**kw, schedule="fixed", process_weight=0.0)
  np.testing.assert_allclose(out, [[0.707106] * 4, [-0.707106] * 4], atol=1e-5)
  alpha = 0.022361
  mixed = rl_tango_advantages(**kw, train_step=50.0, total_steps=100.0)
  np.testing.assert_allclose(mixed, (1 - alpha) * np.asarray(out) + alpha * np.asarray(proc),
                             atol=1e-5)
  w, state = class_balance_weights(np.array([True, True, True, False]), class_balance_init())
  np.testing.assert_allclose(w, [0.845299, 0.845299, 0.845299, 1.464102], atol=1e-5)
  assert bool(state.seen) and float(state.pos) == 3.0 and float(state.neg) == 1.0


def _batch(seed):
  rng = np.random.default_rng(seed)
  v = rng.choice([1 / 3, -1 / 3], (B, K)).astype(np.float32)
  ok = rng.random((B, K)) > 0.25
  lengths = rng.integers(1, T + 1, B)
  lengths[5] = 0
  mask = np.arange(T)[None, :] < lengths[:, None]
  sid = np.where(mask, np.minimum(np.arange(T) // 2, K - 1), -1).astype(np.int32)
  r = rng.choice([0.0, 1.0], B).astype(np.float32)
  gid = rng.permutation(np.arange(B) // G).astype(np.int32)
  return r, v, ok, sid, gid, mask


def ref_tango(r, v, ok, sid, gid, mask, alpha):
  valid = mask.any(1)
  a_out = np.zeros(B)
  for i in np.flatnonzero(valid):
    x = r[valid & (gid == gid[i])]
    a_out[i] = (r[i] - x.mean()) / (x.std(ddof=1) + 1e-6) if len(x) > 1 else 0.0
  ends = {}
  for i in range(B):
    for k in range(K):
      ts = [t for t in range(T) if mask[i, t] and sid[i, t] == k]
      if ts and ok[i, k] and valid[i]:
        ends[i, k] = ts[-1]
  z = {}
  for g in range(N):
    cells = [c for c in ends if gid[c[0]] == g]
    x = np.array([v[c] for c in cells], np.float64)
    mu, sd = (x.mean(), x.std(ddof=1)) if len(x) > 1 else (0.0, 1.0)
    for c in cells:
      z[c] = (v[c] - mu) / (sd + 1e-6)
  out = np.zeros((B, T))
  for i in np.flatnonzero(valid):
    for t in range(T):
      if mask[i, t]:
        proc = sum(z[c] for c in ends if c[0] == i and ends[c] >= t)
        out[i, t] = (1 - alpha) * a_out[i] + alpha * proc
  return out


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_numpy(seed):
  r, v, ok, sid, gid, mask = _batch(seed)
  got = rl_tango_advantages(reward=r, step_reward=v, step_mask=ok, step_id=sid, group_id=gid,
                            response_mask=mask, num_groups=N, train_step=30.0,
                            total_steps=100.0, alpha0=0.5)
  alpha = float(rl_tango_alpha(30.0, total_steps=100.0))
  np.testing.assert_allclose(got, ref_tango(r, v, ok, sid, gid, mask, alpha), atol=1e-5)


def test_alpha_schedule_is_traced_and_floors_at_alpha_min():
  steps = np.array([0.0, 50.0, 100.0, 400.0], np.float32)
  got = jax.jit(jax.vmap(lambda s: rl_tango_alpha(s, total_steps=100.0)))(steps)
  np.testing.assert_allclose(got, [0.5, 0.5 / np.sqrt(500), 1e-3, 1e-3], rtol=1e-5)


def test_class_balance_ema_and_modes():
  state = class_balance_init()
  w, state = class_balance_weights(np.array([True, True, True, False]), state)
  w, state = class_balance_weights(np.array([True, False, False, False]), state, decay=0.8)
  pos, neg = 0.8 * 3 + 0.2 * 1, 0.8 * 1 + 0.2 * 3
  np.testing.assert_allclose([state.pos, state.neg], [pos, neg], rtol=1e-6)
  c = np.array([pos, neg, neg, neg]) ** -0.5
  np.testing.assert_allclose(w, c / c.mean(), rtol=1e-5)
  w, _ = class_balance_weights(np.array([True, False, True]), class_balance_init(),
                               mode="inverse", valid=np.array([True, True, False]))
  np.testing.assert_allclose(w, [1.0, 1.0, 0.0], rtol=1e-6)


def test_bad_arguments():
  r, v, ok, sid, gid, mask = _batch(0)
  kw = dict(reward=r, step_reward=v, step_mask=ok, step_id=sid, group_id=gid,
            response_mask=mask, num_groups=N)
  with pytest.raises(ValueError, match="schedule"):
    rl_tango_advantages(**kw, schedule="linear")
  with pytest.raises(ValueError, match="mode"):
    class_balance_weights(np.array([True]), class_balance_init(), mode="log")
