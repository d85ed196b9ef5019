"""VeRPO unit-test rewards (credit/advantages/shaping/verpo_tests.py)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from credit.advantages.shaping import (VeRPOTestsState, verpo_tests_advantages,
                                       verpo_tests_init_state)
from tests.advantages.outcome._harness import (N, NUM_PROMPTS, Case, bt, fixed_batch,
                                               grpo_rows, reference_test, row0, valid_groups)
from tests.advantages.shaping._harness_a import grpo_on, jcall, one_group

FIELDS = ("test_pass", "test_mask", "group_id", "response_mask")


def shaped_reward(b, alpha=0.5, rate=None):
  """R [B] (float64) from per-(row, test) pass rates `rate` (default: the group's)."""
  valid, _ = valid_groups(b)
  p = b["test_pass"].astype(np.float64)
  ok = b["test_mask"].astype(bool) & valid[:, None]
  gid = b["group_id"]
  B, U = p.shape
  if rate is None:
    rate = np.zeros((B, U))
    for i in range(B):
      for u in range(U):
        peers = ok[:, u] & (gid == gid[i])
        rate[i, u] = p[peers, u].mean() if peers.any() else 0.0
  R = np.zeros(B)
  for i in range(B):
    us = np.nonzero(ok[i])[0]
    if us.size == 0:
      continue
    hard = 1.0 - rate[i, us]
    w = hard / hard.sum() if hard.sum() > 0 else np.full(us.size, 1.0 / us.size)
    d = float(np.sum(w * p[i, us]))
    o = float(np.prod(p[i, us]))
    R[i] = o + (1 - o) * alpha * d
  return R


def ref_verpo_tests(b, alpha=0.5, singleton="zero", scale="group"):
  R = shaped_reward(b, alpha)
  if scale == "group":
    return (grpo_on(b, R, singleton=singleton),)
  return (bt(grpo_rows(b, R, scale, singleton=singleton), b),)   # batch σ, or no division


CASES = [
    Case("verpo_tests", "verpo_tests", FIELDS, ref_verpo_tests),
    Case("verpo_tests_raw", "verpo_tests", FIELDS, ref_verpo_tests,
         (("alpha", 0.8), ("singleton", "raw"))),
    Case("verpo_tests_none", "verpo_tests", FIELDS, ref_verpo_tests, (("scale", "none"),)),
    Case("verpo_tests_batch_raw", "verpo_tests", FIELDS, ref_verpo_tests,
         (("scale", "batch"), ("singleton", "raw"))),
]

test_matches_numpy_reference = reference_test(CASES)

# Worked example: 4 rollouts, 3 tests.
PASS = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)


def test_worked_example():
  out = jcall(verpo_tests_advantages, test_pass=PASS, test_mask=np.ones((4, 3), bool), **one_group(4))
  R = np.array([1.0, 0.25, 0.083333, 0.0])           # π=[.75,.5,.25], w=[1/6,1/3,1/2]
  want = (R - R.mean()) / (R.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(row0(out.advantages), want, atol=1e-5)
  assert out.state is None
  # scale="none" (Dr. GRPO): R − mean(R) = R − 0.333333, no σ division.
  none = jcall(verpo_tests_advantages, test_pass=PASS, test_mask=np.ones((4, 3), bool),
               scale="none", **one_group(4))
  np.testing.assert_allclose(row0(none.advantages), [0.666667, -0.083333, -0.25, -0.333333],
                             atol=1e-5)


def test_scale_none_keeps_partial_credit_small():
  """Two groups of 4: in group 0 nobody passes every test (R ≤ α differ by chance partial
  credit), in group 1 one row passes all. The σ division makes group 0's spread as large as
  group 1's; scale="none" keeps it below α while group 1's best row stays near 1."""
  p = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0],
                [1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]], np.float32)
  kw = dict(test_pass=p, test_mask=np.ones((8, 3), bool), group_id=np.repeat([0, 1], 4).astype(
      np.int32), response_mask=np.ones((8, 2), bool), num_groups=2)
  std = row0(jcall(verpo_tests_advantages, **kw).advantages)
  none = row0(jcall(verpo_tests_advantages, **kw, scale="none").advantages)
  spread = lambda a, g: a[4 * g:4 * g + 4].max() - a[4 * g:4 * g + 4].min()
  # R: group 0 [.15, .15, 0, 0], group 1 [1, .125, 0, 0] (σ 0.087 and 0.483).
  assert spread(std, 0) > 0.8 * spread(std, 1)          # chance credit blown up to full size
  np.testing.assert_allclose([spread(none, 0), spread(none, 1)], [0.15, 1.0], atol=1e-6)
  np.testing.assert_array_equal(np.sign(std), np.sign(none))   # same direction per row


def test_all_pass_gives_uniform_weights_and_no_tests_gives_zero_reward():
  # All rows pass test 0 (weight 0 when others are harder); here every test passes for rows
  # 0-1 and none is hard for the all-pass group -> uniform weights, R = o.
  p = np.array([[1, 1], [1, 1], [1, 0], [0, 0]], np.float32)
  tm = np.ones((4, 2), bool)
  tm[3] = False                                    # row 3: no tests -> R = 0
  a = row0(jcall(verpo_tests_advantages, test_pass=p, test_mask=tm, **one_group(4)).advantages)
  # π over rows with the test: test 0 [1,1,1] -> 1, test 1 [1,1,0] -> 2/3; row 2: w=[0,1],
  # d = 0 -> R = [1, 1, 0, 0].
  R = np.array([1.0, 1.0, 0.0, 0.0])
  np.testing.assert_allclose(a, (R - R.mean()) / (R.std(ddof=1) + 1e-6), atol=1e-5)
  p2 = np.ones((4, 2), np.float32)                 # everyone passes everything: all zeros
  a2 = jcall(verpo_tests_advantages, test_pass=p2, test_mask=np.ones((4, 2), bool), **one_group(4))
  assert np.all(np.asarray(a2.advantages) == 0.0)


def _ema_ref(b, state, decay):
  """(new rate [P,U_max], new seen, per-row EMA rate [B,U])."""
  valid, groups = valid_groups(b)
  p = b["test_pass"].astype(np.float64)
  ok = b["test_mask"].astype(bool) & valid[:, None]
  rate = np.asarray(state.rate, np.float64).copy()
  seen = np.asarray(state.seen).copy()
  U = p.shape[1]
  per_row = np.zeros(p.shape)
  for rows in groups:
    slot = b["prompt_id"][rows[0]]
    for u in range(U):
      have = [i for i in rows if ok[i, u]]
      if have:
        pi = p[have, u].mean()
        rate[slot, u] = decay * rate[slot, u] + (1 - decay) * pi if seen[slot, u] else pi
        seen[slot, u] = True
    per_row[rows] = rate[slot, :U]
  return rate, seen, per_row


def test_state_ema_over_two_steps():
  decay = 0.7
  fn = jax.jit(lambda data, st: verpo_tests_advantages(
      **data, state=st, num_groups=N, decay=decay, difficulty="ema"))
  state = verpo_tests_init_state(NUM_PROMPTS, num_tests=5)
  want_state = state
  for seed in (3, 4):
    b = fixed_batch(seed)
    data = {f: b[f] for f in FIELDS + ("prompt_id",)}
    out = fn(data, state)
    rate, seen, per_row = _ema_ref(b, want_state, decay)
    np.testing.assert_allclose(np.asarray(out.state.rate), rate, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.state.seen), seen)
    R = shaped_reward(b, rate=per_row)
    np.testing.assert_allclose(np.asarray(out.advantages), grpo_on(b, R), atol=2e-4)
    state, want_state = out.state, VeRPOTestsState(rate, seen)


def test_bad_arguments_raise():
  kw = dict(test_pass=PASS, test_mask=np.ones((4, 3), bool), **one_group(4))
  with pytest.raises(ValueError, match="difficulty"):
    verpo_tests_advantages(**kw, difficulty="batch")
  with pytest.raises(ValueError, match="scale"):
    verpo_tests_advantages(**kw, scale="std")
  with pytest.raises(ValueError, match="needs a state"):
    verpo_tests_advantages(**kw, difficulty="ema")
  with pytest.raises(ValueError, match="prompt_id"):
    verpo_tests_advantages(**kw, state=verpo_tests_init_state(2))
  with pytest.raises(ValueError, match="num_tests"):
    verpo_tests_advantages(**kw, state=verpo_tests_init_state(2, num_tests=2),
                           prompt_id=np.zeros(4, np.int32))
  with pytest.raises(ValueError, match="num_prompts"):
    verpo_tests_init_state(0)
