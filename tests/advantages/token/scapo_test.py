"""Tests for the SCAPO estimator (credit/advantages/token/scapo.py).

The numpy reference is written from the
formula. Registry-wide properties (including the state passing through jit and sharding)
live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.token import scapo as sc
from tests.advantages.token._harness import (assert_reduces_to_grpo, assert_sign_kept, grpo_of,
                                             reference_test, table)
from tests.advantages.token._ref import (EPS, G, M, N, T, B, batches, pick, ref_grpo,
                                         valid_tokens)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_interventions")
LP = np.array([-0.1, -1.0, -0.3, -2.0])
SPEC_DRIFT = np.array([0.0090, 0.1367, 0.0181, 0.1429])
SPEC_U = [1.0, 0.0461, 0.9320, 0.0]
SPEC_A = {0: [-1.0, -0.5230, -0.9660, -0.5], 50: [-1.0, -0.7615, -0.9830, -0.75],
          100: [-1.0, -1.0, -1.0, -1.0]}
CONFIGS = {
    "default": dict(),
    "strong_population": dict(shrink=1.0, anneal_steps=10.0, group_std="population"),
    "nostd_fast": dict(shrink=0.3, group_std="none", group_size=G),
}


def ref_scapo(b, step, *, shrink=0.5, anneal_steps=100.0, group_size=None,
              group_std="unbiased", eps=EPS):
  mask = b["response_mask"]
  adv = ref_grpo(b["reward"], b["group_id"], mask, group_size=group_size, group_std=group_std)
  lam = shrink * max(0.0, 1.0 - step / anneal_steps) if anneal_steps > 0 else 0.0
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    ts = valid_tokens(mask, i)
    if not ts:
      continue
    p = lambda x: np.exp(np.float64(x))
    d = [np.mean([abs(p(b["logprob_interventions"][i, t, m]) - p(b["logprob_old"][i, t]))
                  for m in range(M)]) for t in ts]
    lo, hi = min(d), max(d)
    for t, x in zip(ts, d):
      u = 1.0 - (x - lo) / (hi - lo + eps)
      out[i, t] = adv[i] * (1.0 - lam * (1.0 - u))
  return out


def _draw_state(data):
  return dict(state=sc.SCAPOState(step=np.int32(data.draw(st.sampled_from([0, 3, 7, 60, 200])))))


def _ref_scapo_output(b, **cfg):
  """(advantages, the state's next step) for the batch's drawn `state`."""
  step = int(b["state"].step)
  return ref_scapo(b, step, **cfg), step + 1


CASES = table(sc.scapo_advantages, FIELDS + ("state",), _ref_scapo_output, CONFIGS,
              draw=_draw_state)
test_matches_numpy_reference = reference_test(CASES, max_examples=12)


def _example(step):
  p = np.exp(LP)
  sf = np.log(p + SPEC_DRIFT)                    # two identical interventions: drift = SPEC_DRIFT
  row = lambda x: np.tile(np.asarray(x, np.float32)[None], (2,) + (1,) * np.ndim(x))
  return dict(reward=np.array([0.0, 1.0]), group_id=np.zeros(2, np.int32),
              response_mask=np.ones((2, 4), bool), logprob_old=row(LP),
              logprob_interventions=row(np.stack([sf, sf], -1)),
              state=sc.SCAPOState(step=np.int32(step)), num_groups=1, group_std="population")


def test_registered_in_token_family():
  spec = registry.get_estimator("scapo")
  assert spec.family == "token" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS) and spec.stateful and spec.returns_output
  assert int(spec.init_state(5).step) == 0


def test_doctests():
  res = doctest.testmod(sc, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


@pytest.mark.parametrize("step", sorted(SPEC_A))
def test_spec_example(step):
  kw = _example(step)
  u = sc.scapo_stability(response_mask=kw["response_mask"][:1],
                         logprob_old=kw["logprob_old"][:1],
                         logprob_interventions=kw["logprob_interventions"][:1])
  np.testing.assert_allclose(np.asarray(u[0]), SPEC_U, atol=1e-3)
  out = sc.scapo_advantages(**kw)
  np.testing.assert_allclose(np.asarray(out.advantages[0]), SPEC_A[step], atol=1e-3)
  np.testing.assert_allclose(np.asarray(out.advantages[1]), -np.asarray(SPEC_A[step]),
                             atol=1e-3)
  assert int(out.state.step) == step + 1


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_reductions_and_shrink_only(b):
  grpo = grpo_of(b)
  kw = dict(pick(b, *FIELDS), num_groups=N)
  s0 = sc.scapo_init_state()
  stable = dict(kw, logprob_interventions=np.repeat(b["logprob_old"][..., None], M, -1))
  assert_reduces_to_grpo([sc.scapo_advantages(state=s0, shrink=0.0, **kw),
                          sc.scapo_advantages(state=sc.SCAPOState(step=np.int32(100)), **kw),
                          sc.scapo_advantages(state=s0, anneal_steps=0.0, **kw),
                          sc.scapo_advantages(state=s0, **stable)], grpo, rtol=1e-6, atol=1e-7)
  a = np.asarray(sc.scapo_advantages(state=s0, **kw).advantages)
  assert_sign_kept(a, grpo)
  assert np.all(np.abs(a) <= np.abs(grpo) + 1e-7)
  assert np.all(np.abs(a) >= 0.5 * np.abs(grpo) - 1e-6)


def test_anneal_is_monotone_and_the_state_advances():
  kw = _example(0)
  state, prev = kw.pop("state"), None
  for _ in range(3):
    out = sc.scapo_advantages(state=state, anneal_steps=2.0, **kw)
    mag = np.abs(np.asarray(out.advantages))
    if prev is not None:
      assert np.all(mag >= prev - 1e-7)
    prev, state = mag, out.state
  assert int(state.step) == 3
  np.testing.assert_allclose(prev, 1.0, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(group_std="sample"), "group_std"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), logprob_old=np.zeros((B, T), np.float32),
              logprob_interventions=np.zeros((B, T, M), np.float32),
              state=sc.scapo_init_state(), num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    sc.scapo_advantages(**base)


def test_bad_shapes_raise():
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), logprob_old=np.zeros((B, T), np.float32),
              state=sc.scapo_init_state(), num_groups=N)
  for bad in (np.zeros((B, T), np.float32), np.zeros((B, T + 1, M), np.float32)):
    with pytest.raises(AssertionError):
      sc.scapo_advantages(logprob_interventions=bad, **base)
  with pytest.raises(ValueError, match="num_prompts"):
    sc.scapo_init_state(0)


@pytest.mark.parametrize("num_m", [1, 3])
def test_unrolled_intervention_mean_equals_the_reduction(num_m, monkeypatch):
  """The mean over M interventions as unrolled adds (M <= 8) equals the [B,T,M] reduction."""
  rng = np.random.default_rng(5)
  kw = dict(response_mask=rng.random((4, 7)) < 0.8,
            logprob_old=-rng.random((4, 7)).astype(np.float32),
            logprob_interventions=-rng.random((4, 7, num_m)).astype(np.float32))
  unrolled = np.asarray(sc.scapo_stability(**kw))
  monkeypatch.setattr(sc, "_UNROLL_INTERVENTIONS", 0)
  np.testing.assert_allclose(np.asarray(sc.scapo_stability(**kw)), unrolled, rtol=1e-6,
                             atol=1e-7)
