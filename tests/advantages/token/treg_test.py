"""Tests for the T-REG estimator and regulariser (credit/advantages/token/treg.py).

Source: the paper's method-section equations (arXiv 2412.02685). The numpy reference is
written from the
formulas. Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import math

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import registry
from credit.advantages.token import treg as tr
from tests.advantages.token._harness import (assert_budget_kept, assert_reduces_to_grpo,
                                             assert_sign_kept, grpo_of, reference_test, table)
from tests.advantages.token._ref import G, N, T, B, batches, pick, ref_grpo, valid_tokens

FIELDS = ("reward", "group_id", "response_mask", "logprob_alt_pos", "logprob_alt_neg")
PLUS = np.array([[-0.5, -1.0, -0.2]], np.float32)
MINUS = np.array([[-1.5, -0.8, -0.2]], np.float32)
# r̂ = σ(ℓ⁺ − ℓ⁻) − ½ (paper): σ(1) − ½, σ(−0.2) − ½, 0.
SPEC_R = [0.2311, -0.0498, 0.0]
CONFIGS = {
    "default": dict(),
    "additive_fast": dict(alpha=0.2, group_size=G, group_std="none"),
    "redistribute": dict(mode="redistribute"),
    "redistribute_no_renorm": dict(mode="redistribute", renormalize=False, alpha=0.9,
                                   group_std="population"),
}


def sigmoid(x):
  return 1.0 / (1.0 + math.exp(-x))


def ref_treg(b, *, alpha=0.5, mode="additive", renormalize=True, group_size=None,
             group_std="unbiased"):
  mask = b["response_mask"]
  adv = ref_grpo(b["reward"], b["group_id"], mask, group_size=group_size, group_std=group_std)
  gid = np.arange(B) // group_size if group_size is not None else b["group_id"]
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    ts = valid_tokens(mask, i)
    if not ts or (group_size is None and not 0 <= gid[i] < N):
      continue
    r = [sigmoid(float(b["logprob_alt_pos"][i, t]) - float(b["logprob_alt_neg"][i, t])) - 0.5
         for t in ts]
    if mode == "additive":
      for t, x in zip(ts, r):
        out[i, t] = adv[i] + alpha * x
      continue
    w = [max(1 + alpha * float(np.sign(adv[i])) * x, 0.0) for x in r]
    if renormalize:
      w = [len(ts) * x / sum(w) for x in w]
    for t, x in zip(ts, w):
      out[i, t] = adv[i] * x
  return out


CASES = table(tr.treg_advantages, FIELDS, ref_treg, CONFIGS)
test_matches_numpy_reference = reference_test(CASES, max_examples=12)


def test_registered_in_token_family():
  spec = registry.get_estimator("treg")
  assert spec.family == "token" and spec.confidence == "paper-equation"
  assert spec.needs == set(FIELDS)
  assert "2412.02685" in spec.paper


def test_doctests():
  res = doctest.testmod(tr, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  r = tr.treg_token_rewards(response_mask=np.ones((1, 3), bool), logprob_alt_pos=PLUS,
                            logprob_alt_neg=MINUS)
  np.testing.assert_allclose(np.asarray(r[0]), SPEC_R, atol=1e-4)
  r2 = tr.treg_token_rewards(response_mask=np.ones((1, 3), bool), logprob_alt_pos=PLUS,
                             logprob_alt_neg=MINUS, scale=2.0)     # the earlier tanh(Δ/2)
  np.testing.assert_allclose(np.asarray(r2[0]), [0.4621, -0.0997, 0.0], atol=1e-4)
  kw = dict(reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
            response_mask=np.ones((2, 3), bool), logprob_alt_pos=np.tile(PLUS, (2, 1)),
            logprob_alt_neg=np.tile(MINUS, (2, 1)), num_groups=1, group_std="population")
  # Default (additive): A = Â + α r̂ with Â = ±1, α = 0.5.
  add = np.asarray(tr.treg_advantages(**kw))
  np.testing.assert_allclose(add, [[1 + 0.5 * x for x in SPEC_R],
                                   [-1 + 0.5 * x for x in SPEC_R]], atol=1e-4)
  # "redistribute": w = 1 ± α r̂, renormalised to sum 3.
  w_pos = np.array([1 + 0.5 * x for x in SPEC_R])
  w_neg = np.array([1 - 0.5 * x for x in SPEC_R])
  red = np.asarray(tr.treg_advantages(mode="redistribute", **kw))
  np.testing.assert_allclose(red, [3 * w_pos / w_pos.sum(), -3 * w_neg / w_neg.sum()],
                             atol=1e-4)


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_reductions_sign_and_budget(b):
  grpo = grpo_of(b)
  kw = pick(b, *FIELDS)
  agree = dict(kw, logprob_alt_neg=b["logprob_alt_pos"])
  assert_reduces_to_grpo([tr.treg_advantages(num_groups=N, mode=mode, **extra)
                          for mode in ("redistribute", "additive")
                          for extra in (dict(kw, alpha=0.0), agree)], grpo, rtol=1e-5, atol=1e-6)
  a = np.asarray(tr.treg_advantages(num_groups=N, mode="redistribute", **kw), np.float64)
  assert_sign_kept(a, grpo)
  assert_budget_kept(a, grpo)


def test_regularizer_loss():
  mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
  lp = np.array([[-0.3, -1.2, -0.5], [-0.7, -0.1, 0.0]], np.float32)
  ref = np.array([[-0.5, -1.0, -0.5], [-0.2, -0.3, 0.0]], np.float32)
  plus = np.array([[-0.5, -1.0, -0.2], [-1.0, -0.4, 0.0]], np.float32)
  minus = np.array([[-1.5, -0.8, -0.2], [-0.5, -0.6, 0.0]], np.float32)
  kw = dict(logprob_alt_pos=plus, logprob_alt_neg=minus, response_mask=mask)
  rhat = lambda i, t: sigmoid(float(plus[i, t] - minus[i, t])) - 0.5
  # Paper form: L_REG = −Σ_t β r̂_t log π_θ(y_t), times the pair weight w.
  w = np.array([0.3, 0.8], np.float32)
  got = np.asarray(tr.treg_regularizer_loss(logprob=lp, pair_weight=w, **kw))
  want = [w[i] * -0.1 * sum(rhat(i, t) * float(lp[i, t]) for t in valid_tokens(mask, i))
          for i in range(2)]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  mean = np.asarray(tr.treg_regularizer_loss(logprob=lp, token_reduce="mean", **kw))
  np.testing.assert_allclose(mean * [3, 2], np.asarray(
      tr.treg_regularizer_loss(logprob=lp, **kw)), rtol=1e-5)
  # Gradient: −β r̂_t · w: raising log π on a token with r̂ > 0 lowers the loss.
  g = jax.grad(lambda x: tr.treg_regularizer_loss(logprob=x, pair_weight=w, **kw).sum())(
      jnp.asarray(lp))
  np.testing.assert_allclose(float(g[0, 0]), -0.1 * 0.3 * rhat(0, 0), rtol=1e-5)
  assert float(g[1, 2]) == 0.0
  # The pair weight is DPO's: σ(β(Σℓ_l − Σℓ_w)).
  pw = tr.treg_pair_weight(chosen_logratio=np.array([2.0]), rejected_logratio=np.array([-1.0]),
                           beta=0.5)
  np.testing.assert_allclose(np.asarray(pw), [sigmoid(-1.5)], rtol=1e-6)
  # The earlier agreement form (ours), kept as an option.
  got = np.asarray(tr.treg_regularizer_loss(logprob=lp, logprob_ref=ref, form="agreement",
                                            **kw))
  want = []
  for i in range(2):
    ts = valid_tokens(mask, i)
    terms = [-math.log(sigmoid(rhat(i, t) * 0.1 * float(lp[i, t] - ref[i, t]) / 0.1))
             for t in ts]
    want.append(sum(terms) / len(ts))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  with pytest.raises(ValueError, match="logprob_ref"):
    tr.treg_regularizer_loss(logprob=lp, form="agreement", **kw)
  with pytest.raises(ValueError, match="form"):
    tr.treg_regularizer_loss(logprob=lp, form="dpo", **kw)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="sum"), "mode"),
    (dict(group_std="sample"), "group_std"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  z = np.zeros((B, T), np.float32)
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), logprob_alt_pos=z, logprob_alt_neg=z,
              num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    tr.treg_advantages(**base)


def test_shape_mismatch_raises():
  z = np.zeros((B, T), np.float32)
  with pytest.raises(AssertionError):
    tr.treg_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                       response_mask=np.ones((B, T), bool), logprob_alt_pos=z,
                       logprob_alt_neg=np.zeros((B, T + 1), np.float32), num_groups=N)
