"""HyperEyes TRACE cost bonus (credit/advantages/shaping/trace_cost.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.advantages.shaping import (TraceCostState, trace_cost_advantages,
                                       trace_cost_init_state)

N, G, T, P = 3, 6, 4, 5
B = N * G
_trace = jax.jit(trace_cost_advantages, static_argnames=(
    "num_groups", "group_size", "update_ref", "init_missing_ref", "singleton"))


def ref_bonus(stats, ref_tc, ref_tot):
  """The released `compute_group_bonus`, re-written as a loop (stats: (acc, tc, tot))."""
  bon = [None] * len(stats)
  for i, (acc, tc, _) in enumerate(stats):
    if acc <= -0.5:
      bon[i] = 0.0
    elif acc <= 0:
      bon[i] = -0.1 if (tc < ref_tc or tc > int(ref_tc * 1.5)) else 0.0
    elif tc == 0:
      bon[i] = 0.0
  pool = [i for i in range(len(stats)) if bon[i] is None]
  good = [i for i in pool if stats[i][1] <= ref_tc and stats[i][2] <= ref_tot]
  bad = [i for i in pool if i not in good]
  for idx, lo, hi in ((good, 0.05, 0.20), (bad, -0.10, -0.02)):
    keys = sorted({(stats[i][1], stats[i][2]) for i in idx})
    for i in idx:
      r, m = keys.index((stats[i][1], stats[i][2])), len(keys)
      bon[i] = round(hi if m == 1 else hi - (hi - lo) * r / (m - 1), 4)
  return bon


def ref_trace(acc, tc, tot, gid, pid, mask, ref_tc, ref_tot):
  valid = mask.any(1)
  shaped = np.zeros(B)
  for g in range(N):
    rows = [i for i in range(B) if valid[i] and gid[i] == g]
    if not rows:
      continue
    p = pid[rows[0]]
    b = ref_bonus([(acc[i], tc[i], tot[i]) for i in rows], ref_tc[p], ref_tot[p])
    for i, bi in zip(rows, b):
      shaped[i] = acc[i] if acc[i] <= -0.5 else acc[i] + bi
  adv = np.zeros(B)
  for i in np.flatnonzero(valid):
    r = shaped[valid & (gid == gid[i])]
    if len(r) > 1:
      adv[i] = (shaped[i] - r.mean()) / (r.std(ddof=1) + 1e-6)
  return shaped, np.where(mask, adv[:, None], 0.0)


def _batch(seed):
  rng = np.random.default_rng(seed)
  acc = rng.choice([1.0, 0.0, -0.5], B).astype(np.float32)
  tc = rng.integers(0, 5, B).astype(np.int32)
  tot = rng.integers(0, 6, B).astype(np.float32)
  gid = rng.permutation(np.arange(B) // G).astype(np.int32)
  pid = ((gid * 2 + 1) % P).astype(np.int32)
  lengths = rng.integers(0, T + 1, B)
  mask = np.arange(T)[None, :] < lengths[:, None]
  state = TraceCostState(ref_tc=np.array([3, -1, 2, 1, 4], np.int32),
                         ref_total=np.array([4, -1, 3, 2, 5], np.float32))
  return acc, tc, tot, gid, pid, mask, state


def _run(acc, tc, tot, gid, pid, mask, state, **kw):
  if "singleton" in kw:
    return trace_cost_advantages(reward=acc, tool_calls=tc, tool_cost=tot, group_id=gid,
                                 response_mask=mask, prompt_id=pid, state=state,
                                 num_groups=N, **kw)
  return _trace(reward=acc, tool_calls=tc, tool_cost=tot, group_id=gid, response_mask=mask,
                prompt_id=pid, state=state, num_groups=N, **kw)


def test_spec_example():
  acc = np.array([1, 1, 1, 0, 0, 1], np.float32)
  tc = np.array([2, 3, 2, 1, 4, 0], np.int32)
  tot = np.array([3, 5, 2, 0, 0, 0], np.float32)
  one = np.zeros(6, np.int32)
  state = TraceCostState(ref_tc=jnp.array([3], jnp.int32), ref_total=jnp.array([4.0]))
  out = _trace(reward=acc, tool_calls=tc, tool_cost=tot, group_id=one,
               response_mask=np.ones((6, 2), bool), prompt_id=one, state=state, num_groups=1,
               update_ref=True)
  np.testing.assert_allclose(out.reward, [1.05, 0.98, 1.20, -0.1, 0.0, 1.0], atol=1e-5)
  assert int(out.state.ref_tc[0]) == 2 and float(out.state.ref_total[0]) == 2.0
  # Off by default (the released reward function skips the cache update).
  off = _trace(reward=acc, tool_calls=tc, tool_cost=tot, group_id=one,
               response_mask=np.ones((6, 2), bool), prompt_id=one, state=state, num_groups=1)
  assert int(off.state.ref_tc[0]) == 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_numpy(seed):
  acc, tc, tot, gid, pid, mask, state = _batch(seed)
  out = _run(acc, tc, tot, gid, pid, mask, state)
  shaped, adv = ref_trace(acc, tc, tot, gid, pid, mask, np.asarray(state.ref_tc),
                          np.asarray(state.ref_total))
  np.testing.assert_allclose(out.reward, shaped, atol=1e-5)
  np.testing.assert_allclose(out.advantages, adv, atol=1e-4)


def test_missing_reference_and_update_rules():
  acc, tc, tot, gid, pid, mask, _ = _batch(3)
  mask[:, 0] = True
  acc[:] = 1.0
  tc[:] = np.maximum(tc, 1)
  fresh = trace_cost_init_state(P)
  out = _run(acc, tc, tot, gid, pid, mask, fresh, update_ref=True)
  # No reference: every correct tc > 0 is "bad" (bonus in [-0.10, -0.02]); never established.
  assert np.all((out.reward >= 0.9 - 1e-6) & (out.reward <= 0.98 + 1e-6))
  np.testing.assert_array_equal(out.state.ref_tc, fresh.ref_tc)
  out = _run(acc, tc, tot, gid, pid, mask, fresh, init_missing_ref=True)
  for g in range(N):
    rows = np.flatnonzero(gid == g)
    best = min(zip(tc[rows], tot[rows]))
    assert (int(out.state.ref_tc[pid[rows[0]]]), float(out.state.ref_total[pid[rows[0]]])) \
        == (int(best[0]), float(best[1]))


def test_bad_arguments():
  acc, tc, tot, gid, pid, mask, state = _batch(0)
  with pytest.raises(ValueError, match="singleton"):
    _run(acc, tc, tot, gid, pid, mask, state, singleton="one")
  with pytest.raises(ValueError, match="num_prompts"):
    trace_cost_init_state(0)
