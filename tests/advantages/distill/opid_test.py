"""Tests for the OPID estimator (credit/advantages/distill/opid.py) and its SEED alias
(credit/advantages/distill/seed.py).

Code-verified against jinyangwu/OPID `gigpo/core_gigpo.py`. The numpy reference
(`_ref_ctx.ref_opid`) follows the
code's loops. Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools

import hypothesis
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.distill import opid, seed
from tests.advantages.distill._harness import Case, hypothesis_reference_test
from tests.advantages.distill._ref_ctx import B, G, N, T, batches, pick, ref_opid

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_alt")
CONFIGS = {
    "default": dict(),
    "step_meannorm_zero": dict(mode="mean_norm", singleton="zero", episode_weight=0.5,
                               step_weight=0.25, step=True),
    "normalized_clipped_fast": dict(normalize_teacher=True, clip_teacher=0.7, episode_weight=1.0,
                                    step_weight=0.5, step=True, group_size=G),
    "failed_only": dict(failed_only=True, success_threshold=0.5, episode_weight=1.0),
}


@functools.lru_cache(maxsize=None)
def _compiled(fn, static):
  return jax.jit(functools.partial(fn, **dict(static)))


def call(data, fn=opid.opid_advantages, **static):
  return np.asarray(_compiled(fn, tuple(sorted(static.items())))(**data))


def _args(b, cfg):
  cfg = dict(cfg)
  names = FIELDS + (("logprob_teacher",) if cfg.pop("step", False) else ())
  return pick(b, *names), dict(cfg, num_groups=N)


def test_registered():
  o, s = registry.get_estimator("opid"), registry.get_estimator("seed")
  assert o.family == s.family == "distill"
  assert o.confidence == "code-verified" and s.confidence == "inferred"
  assert o.needs == s.needs == set(FIELDS)
  assert o.params == s.params  # SEED takes exactly OPID's arguments


@pytest.mark.parametrize("module", [opid, seed])
def test_doctests(module):
  res = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


@pytest.mark.parametrize("fn", [opid.opid_advantages, seed.seed_advantages])
def test_spec_example(fn):
  lp_old = np.tile(np.array([[-0.7, -1.0]], np.float32), (4, 1))
  lp_ep = lp_old.copy()
  lp_ep[1] = [-0.2, -1.5]
  a = call(dict(reward=np.array([1., 0., 0., 1.], np.float32), group_id=np.zeros(4, np.int32),
                response_mask=np.ones((4, 2), bool), logprob_old=lp_old, logprob_alt=lp_ep),
           fn=fn, num_groups=1)
  # A_ep = [0.866024, −0.866024, −0.866024, 0.866024]; rows without a skill keep it.
  np.testing.assert_allclose(a[[0, 2, 3]], [[0.866024] * 2, [-0.866024] * 2, [0.866024] * 2],
                             atol=1e-5)
  np.testing.assert_allclose(a[1], [-0.865524, -0.866524], atol=1e-5)


def _case(name, cfg):
  """`step` (the reference's step term) switches the `logprob_teacher` field on."""
  cfg = dict(cfg)
  step = cfg.pop("step", False)
  return Case(name, opid.opid_advantages, FIELDS + (("logprob_teacher",) if step else ()),
              ref_opid, tuple(sorted(cfg.items())), ref_kwargs=(("step", step),) if step else (),
              strategy=batches, num_groups=N, rtol=1e-4, atol=1e-5)


CASES = [_case(name, cfg) for name, cfg in sorted(CONFIGS.items())]
test_matches_numpy_reference = hypothesis_reference_test(CASES, max_examples=4)


@hypothesis.settings(max_examples=4, deadline=None)
@hypothesis.given(b=batches())
def test_seed_equals_opid(b):
  arrays, static = _args(b, CONFIGS["step_meannorm_zero"])
  np.testing.assert_array_equal(call(arrays, fn=seed.seed_advantages, **static),
                                call(arrays, **static))


def test_singleton_follows_the_code():
  # A lone trajectory: μ = 0, σ = 1 (code) → R/(1+ε); "zero" gives 0; mean_norm gives R.
  data = dict(reward=np.array([0.75, 0.0], np.float32), group_id=np.array([0, 1], np.int32),
              response_mask=np.array([[1, 1], [0, 0]], bool),
              logprob_old=np.zeros((2, 2), np.float32), logprob_alt=np.zeros((2, 2), np.float32))
  np.testing.assert_allclose(call(data, num_groups=2)[0], 0.75 / (1 + 1e-6), rtol=1e-7)
  np.testing.assert_array_equal(call(data, num_groups=2, mode="mean_norm")[0], 0.75)
  np.testing.assert_array_equal(call(data, num_groups=2, singleton="zero")[0], 0.0)


def test_no_skill_rows_and_zero_weights_give_the_episode_advantage():
  rng = np.random.default_rng(3)
  lp = rng.uniform(-3, 0, (B, T)).astype(np.float32)
  data = dict(reward=rng.choice(np.array([0., 1.], np.float32), B),
              group_id=np.arange(B, dtype=np.int32) // G, response_mask=np.ones((B, T), bool),
              logprob_old=lp, logprob_alt=lp)
  base = call(data, num_groups=N, episode_weight=0.0)
  np.testing.assert_array_equal(call(data, num_groups=N), base)   # ℓ_ep = ℓˢ: no skill
  # Each row's advantage is constant over its tokens (the episode advantage).
  np.testing.assert_array_equal(base, np.repeat(base[:, :1], T, axis=1))


def test_teacher_term_is_a_stopped_log_prob_shift():
  def f(lp_alt):
    return opid.opid_advantages(
        reward=np.array([1., 0.], np.float32), group_id=np.zeros(2, np.int32),
        response_mask=np.ones((2, 3), bool), logprob_old=np.zeros((2, 3), np.float32),
        logprob_alt=lp_alt, num_groups=1).sum()
  g = jax.jit(jax.grad(f))(np.full((2, 3), -1.0, np.float32))
  assert np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="std_norm"), "mode"),
    (dict(singleton="one"), "singleton"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  z = np.zeros((B, T), np.float32)
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), logprob_old=z, logprob_alt=z, num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    opid.opid_advantages(**base)


# --------------------------------------------------------------------------
# The GiGPO step term (gigpo_step), against the code's step-layout functions transcribed:
# `compute_step_discounted_returns`, `build_step_group` (exact matching) and
# `step_norm_reward` (jinyangwu/OPID gigpo/core_gigpo.py).
# --------------------------------------------------------------------------


def code_step_advantages(reward_BK, valid_BK, key_BK, group_B, gamma=0.95, eps=1e-6,
                         remove_std=False):
  """{(b, k): Ã} from one step row per valid turn (trajectory b, prompt index, anchor obs)."""
  rows = [(b, k) for b in range(valid_BK.shape[0]) for k in range(valid_BK.shape[1])
          if valid_BK[b, k]]
  ret = {}
  for b in {b for b, _ in rows}:          # discounted returns per trajectory, last to first
    run = 0.0
    for k in reversed([k for bb, k in rows if bb == b]):
      run = reward_BK[b, k] + gamma * run
      ret[(b, k)] = run
  groups = {}
  for b, k in rows:                        # step groups: (prompt index, identical anchor obs)
    groups.setdefault((group_B[b], key_BK[b, k]), []).append((b, k))
  out = {}
  for members in groups.values():
    scores = np.array([ret[c] for c in members], np.float64)
    mean = scores.mean()
    std = 1.0 if len(scores) == 1 else scores.std(ddof=1)
    for c, x in zip(members, scores):
      out[c] = x - mean if remove_std else (x - mean) / (std + eps)
  return out


def _gigpo_batch(seed):
  rng = np.random.default_rng(seed)
  Bn, K, Tn = 8, 3, 7
  gid = np.repeat(np.arange(2), 4).astype(np.int32)
  n_turns = rng.integers(1, K + 1, Bn)
  step_mask = np.arange(K)[None, :] < n_turns[:, None]
  turn_id = np.full((Bn, Tn), -1, np.int32)
  for b in range(Bn):
    for k in range(n_turns[b]):
      turn_id[b, 2 * k:2 * k + 2] = k
  mask = turn_id >= 0
  lp_old = rng.normal(-1, 0.3, (Bn, Tn)).astype(np.float32)
  return dict(reward=rng.choice([0.0, 1.0], Bn).astype(np.float32), group_id=gid,
              response_mask=mask, logprob_old=lp_old, logprob_alt=lp_old.copy(),
              step_reward=rng.choice([0.0, 0.5, 1.0], (Bn, K)).astype(np.float32),
              state_key=rng.integers(100, 103, (Bn, K)).astype(np.int32) * 7919,
              step_mask=step_mask, turn_id=turn_id)


@pytest.mark.parametrize("seed_", (0, 1, 2))
@pytest.mark.parametrize("mode", ("mean_std_norm", "mean_norm"))
def test_gigpo_step_term_matches_the_code(seed_, mode):
  b = _gigpo_batch(seed_)
  base = {k: b[k] for k in FIELDS}
  off = call(base, num_groups=2, mode=mode)
  on = call(b, num_groups=2, mode=mode, gigpo_step=True, gigpo_weight=0.5)
  want = code_step_advantages(b["step_reward"], b["step_mask"], b["state_key"], b["group_id"],
                              remove_std=mode == "mean_norm")
  assert len(want) > len({c for c in want if want[c] == 0.0})  # some step groups are shared
  expect = np.zeros_like(off)
  for (i, k), a in want.items():
    expect[i, b["turn_id"][i] == k] = 0.5 * a
  np.testing.assert_allclose(on - off, expect, rtol=1e-5, atol=1e-5)


def test_gigpo_step_term_needs_its_fields():
  b = _gigpo_batch(0)
  with pytest.raises(ValueError, match="state_key"):
    opid.opid_advantages(**{k: b[k] for k in FIELDS}, num_groups=2, gigpo_step=True)
  spec = registry.get_estimator("opid")
  assert {"step_reward", "state_key", "step_mask", "turn_id"} <= spec.needs_for({"gigpo_step": True})
