"""PiCA (credit/advantages/turn/pica.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import pica
from tests.advantages.turn.igpo_test import batch, np_layout
from tests.contract_fields import N  # noqa: F401  (shared layout)


def np_token_rewards(b, mode="code", step_scale=0.3, outcome_scale=1.5, gamma=1.0):
  row, valid, last = np_layout(b)
  rho = b["step_reward"].astype(np.float64)
  m, tid = b["response_mask"], b["turn_id"]
  Bn, K = valid.shape
  r = np.zeros((Bn, K))
  for i in range(Bn):
    ks = list(np.nonzero(valid[i])[0])
    for n, k in enumerate(ks):
      if mode == "code":
        pen = 0.3 * 1.5 ** (n - 2) if n >= 3 else 0.0
        r[i, k] = rho[i, k] - 0.55 - pen
      else:  # survival potential: no step up to k wrong; the last step ends the episode
        before = np.prod([rho[i, j] for j in ks[:n]])
        after = 0.0 if n + 1 == len(ks) else before * rho[i, k]
        r[i, k] = gamma * after - before
  x = np.zeros(m.shape)
  for i in range(Bn):
    pos = np.nonzero(m[i])[0]
    for k in range(K):
      toks = [t for t in pos if tid[i, t] == k]
      if toks:
        x[i, toks[-1]] += step_scale * r[i, k]
    if len(pos):
      if mode == "code":
        x[i, pos[-1]] = 0.0 if tid[i, pos[-1]] >= 0 else x[i, pos[-1]]
      x[i, pos[-1]] += outcome_scale * b["reward"][i]
  return x


def np_gae(x, values, m, gamma=1.0, lam=1.0):
  adv, ret = np.zeros(x.shape), np.zeros(x.shape)
  for i in range(x.shape[0]):
    nv, run = 0.0, 0.0
    for t in reversed(range(x.shape[1])):
      if m[i, t]:
        d = x[i, t] + gamma * nv - values[i, t]
        run = d + gamma * lam * run
        adv[i, t], ret[i, t] = run, run + values[i, t]
        nv = values[i, t]
  return adv, ret


def test_spec_example_step_rewards():
  # The authors' PRM serves h, the probability that the step is wrong; the
  # estimator takes the library's step_reward, the probability that it is right: 1 − h.
  h = np.array([[0.3, 0.2, 0.6, 0.1, 0.4]])
  r = 0.3 * np.asarray(pica.pica_step_rewards(1.0 - h, np.ones((1, 5), bool)))
  np.testing.assert_allclose(r, [[0.045, 0.075, -0.045, -0.03, -0.1875]], atol=1e-6)


def test_placement_and_outcome_overwrite():
  # Two turns of two tokens; the outcome on the last token replaces turn 1's step reward.
  tid = np.array([[0, 0, 1, 1]], np.int32)
  kw = dict(reward=np.array([1.0]), step_reward=np.array([[0.7, 0.8]]),
            step_mask=np.ones((1, 2), bool), turn_id=tid, values=np.zeros((1, 4)),
            response_mask=tid >= 0, whiten=False)
  out = pica.pica_advantages(**kw)
  # token rewards [0, 0.045, 0, 1.5] → returns-to-go (γ = λ = 1, V = 0).
  np.testing.assert_allclose(np.asarray(out.advantages)[0], [1.545, 1.545, 1.5, 1.5], atol=1e-5)
  out = pica.pica_advantages(mode="pbrs", **kw)
  # Φ = 1 before, 0.7 after step 0, terminal 0 after step 1: F = [0.7 − 1, 0 − 0.7]·0.3 =
  # [−0.09, −0.21], outcome added: [0, −0.09, 0, 1.29].
  np.testing.assert_allclose(np.asarray(out.returns)[0], [1.2, 1.2, 1.29, 1.29], atol=1e-5)
  out = pica.pica_advantages(mode="pbrs", pbrs_terminal="outcome", **kw)
  # Φ after the last step = R = 1: F = [−0.09, 0.09] → [0, −0.09, 0, 1.59].
  np.testing.assert_allclose(np.asarray(out.returns)[0], [1.5, 1.5, 1.59, 1.59], atol=1e-5)


def test_right_steps_earn_more_than_a_wrong_one():
  # An exact judge (1 right, 0 wrong): the wrong step's reward is the lowest in both modes,
  # and in PBRS the shaping is −1 exactly at the first wrong step, 0 at every right one.
  rho = np.array([[1.0, 1.0, 0.0, 1.0, 1.0]])
  valid = np.ones((1, 5), bool)
  r = np.asarray(pica.pica_step_rewards(rho, valid, penalty=0.0))[0]
  np.testing.assert_allclose(r, [0.45, 0.45, -0.55, 0.45, 0.45], atol=1e-6)
  term = np.array([[0.0, 0.0, 0.0, 0.0, 1.0]])
  f = np.asarray(pica.pica_step_rewards(rho, valid, mode="pbrs", terminal_BK=term))[0]
  np.testing.assert_allclose(f, [0.0, 0.0, -1.0, 0.0, 1.0], atol=1e-6)


@pytest.mark.parametrize("seed", (0, 3))
@pytest.mark.parametrize("kw", [{}, {"mode": "pbrs", "gamma": 0.9, "lam": 0.8}])
def test_matches_numpy_reference(seed, kw):
  b = batch(seed)
  b["step_reward"] = np.abs(b["step_reward"])
  spec = registry.get_estimator("pica")
  out = pica.pica_advantages(**{n: b[n] for n in spec.needs}, whiten=False, **kw)
  x = np_token_rewards(b, mode=kw.get("mode", "code"), gamma=kw.get("gamma", 1.0))
  adv, ret = np_gae(x, b["values"], b["response_mask"], kw.get("gamma", 1.0), kw.get("lam", 1.0))
  np.testing.assert_allclose(np.asarray(out.advantages), adv, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.returns), ret, rtol=1e-4, atol=1e-5)


def test_suffix_sums_equal_the_cumsum_on_long_rows():
  # Rows long enough for the block sums of `ops.discounted_reverse_cumsum` (γ = λ = 1).
  from credit import ops
  rng = np.random.default_rng(0)
  b, k, t = 4, 3, ops.returns.FAST_RECURRENCE_MIN_T + 30
  mask = rng.random((b, t)) > 0.2
  tid = np.where(mask, np.minimum(np.arange(t) * k // t, k - 1)[None, :], -1).astype(np.int32)
  kw = dict(reward=rng.choice([0.0, 1.0], b).astype(np.float32),
            step_reward=rng.random((b, k)).astype(np.float32), step_mask=np.ones((b, k), bool),
            turn_id=tid, values=rng.uniform(-1, 1, (b, t)).astype(np.float32),
            response_mask=mask)
  got = pica.pica_advantages(**kw)
  mask_BT, _, valid, last, tid_BT = ops.turn_layout(mask, kw["step_mask"], tid)
  r_BK = pica.pica_step_rewards(kw["step_reward"], valid)
  ends = ops.turn_edges(tid_BT, mask_BT, k, last=True)
  step = np.where(ends & ~np.asarray(ops.last_token_mask(mask_BT)),
                  0.3 * np.asarray(ops.turn_broadcast(r_BK, tid_BT)), 0.0)
  want = ops.gae("test", reward=1.5 * kw["reward"], values=kw["values"], response_mask=mask,
                 token_reward=step.astype(np.float32))
  np.testing.assert_allclose(np.asarray(got.advantages), np.asarray(want.advantages),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got.returns), np.asarray(want.returns), rtol=1e-5,
                             atol=1e-5)
