"""Tests for the CSCR estimator (credit/advantages/token/cscr.py).

The numpy reference is written from the
formula. Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import math

import hypothesis
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.token import cscr as cs
from tests.advantages.token._harness import (assert_budget_kept, assert_reduces_to_grpo,
                                             assert_sign_kept, grpo_of, reference_test, table)
from tests.advantages.token._ref import (EPS, G, N, T, B, batches, pick, ref_grpo,
                                         valid_tokens)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_alt_pos",
          "logprob_alt_neg")
LP = np.array([[-0.1, -2.0, -0.5, -1.0]], np.float32)
POS = np.array([[-0.1, -0.5, -0.45, -1.0]], np.float32)
NEG = np.array([[-0.2, -0.8, -0.55, -1.1]], np.float32)
SPEC_W = [1.2592, 0.2225, 1.2592, 1.2592]
CONFIGS = {
    "default": dict(),
    "strong_population": dict(alpha=1.0, group_std="population"),
    "nostd_fast": dict(alpha=0.2, group_std="none", group_size=G),
}


def ref_cscr(b, *, alpha=0.5, group_size=None, group_std="unbiased", eps=EPS):
  mask = b["response_mask"]
  adv = ref_grpo(b["reward"], b["group_id"], mask, group_size=group_size, group_std=group_std)
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    ts = valid_tokens(mask, i)
    if not ts:
      continue
    lp = lambda k, t: float(b[k][i, t])
    s = [abs(lp("logprob_alt_pos", t) - lp("logprob_old", t))
         + abs(lp("logprob_alt_neg", t) - lp("logprob_old", t)) for t in ts]
    mean = sum(s) / len(s)
    e = [math.exp(-alpha * x / (mean + eps)) for x in s]
    for t, x in zip(ts, e):
      out[i, t] = adv[i] * len(ts) * x / sum(e)
  return out


CASES = table(cs.cscr_advantages, FIELDS, ref_cscr, CONFIGS)
test_matches_numpy_reference = reference_test(CASES, max_examples=12)


def test_registered_in_token_family():
  spec = registry.get_estimator("cscr")
  assert spec.family == "token" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(cs, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  w = cs.cscr_weights(response_mask=np.ones((1, 4), bool), logprob_old=LP,
                      logprob_alt_pos=POS, logprob_alt_neg=NEG)
  np.testing.assert_allclose(np.asarray(w[0]), SPEC_W, atol=1e-3)
  # Â = 0.8: rewards ±0.8 with group_std="none" give Â = ±0.8 exactly.
  a = cs.cscr_advantages(reward=np.array([0.8, -0.8]), group_id=np.zeros(2, np.int32),
                         response_mask=np.ones((2, 4), bool), logprob_old=np.tile(LP, (2, 1)),
                         logprob_alt_pos=np.tile(POS, (2, 1)),
                         logprob_alt_neg=np.tile(NEG, (2, 1)), num_groups=1, group_std="none")
  np.testing.assert_allclose(np.asarray(a[0]), [1.0073, 0.1780, 1.0073, 1.0073], atol=1e-3)
  np.testing.assert_allclose(float(a[0].sum()), 3.2, atol=1e-5)
  np.testing.assert_allclose(np.asarray(a[1]), -np.asarray(a[0]), rtol=1e-6)


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_reductions_sign_and_budget(b):
  grpo = grpo_of(b)
  kw = pick(b, *FIELDS)
  same = dict(kw, logprob_alt_pos=b["logprob_old"], logprob_alt_neg=b["logprob_old"])
  assert_reduces_to_grpo([cs.cscr_advantages(num_groups=N, alpha=0.0, **kw),
                          cs.cscr_advantages(num_groups=N, **same)], grpo, rtol=1e-5, atol=1e-6)
  a = np.asarray(cs.cscr_advantages(num_groups=N, **kw), np.float64)
  assert_sign_kept(a, grpo)
  assert_budget_kept(a, grpo)


def test_more_sensitive_tokens_get_less_credit():
  w = np.asarray(cs.cscr_weights(response_mask=np.ones((1, 4), bool), logprob_old=LP,
                                 logprob_alt_pos=POS, logprob_alt_neg=NEG))[0]
  assert w[1] == w.min() and w[1] < 1.0 < w[0]


def test_weights_carry_no_gradient():
  def f(lp):
    return cs.cscr_advantages(reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
                              response_mask=np.ones((2, 4), bool), logprob_old=lp,
                              logprob_alt_pos=np.tile(POS, (2, 1)),
                              logprob_alt_neg=np.tile(NEG, (2, 1)), num_groups=1).sum()
  g = jax.grad(f)(np.tile(LP, (2, 1)))
  assert np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(group_std="sample"), "group_std"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  z = np.zeros((B, T), np.float32)
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), logprob_old=z, logprob_alt_pos=z,
              logprob_alt_neg=z, num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    cs.cscr_advantages(**base)


def test_shape_mismatch_raises():
  z = np.zeros((B, T), np.float32)
  with pytest.raises(AssertionError):
    cs.cscr_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                       response_mask=np.ones((B, T), bool), logprob_old=z,
                       logprob_alt_pos=np.zeros((B, T + 1), np.float32), logprob_alt_neg=z,
                       num_groups=N)
