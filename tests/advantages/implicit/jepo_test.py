"""Tests for multi-sample JEPO (credit/advantages/implicit/jepo.py). Float64 loop
reference from the formulas; registry-wide properties in tests/registry_common_test.py."""
from __future__ import annotations

import functools
import math

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.implicit import jepo
from tests.advantages.implicit._lik import B, G, N, T, answer_rows, batches, to_tokens, valid_rows


def _lme(xs):
  top = max(xs)
  return top + math.log(sum(math.exp(x - top) for x in xs) / len(xs))


def ref(b, group_size=None, reward_scale=1.0):
  """(advantages [B,T], answer weights [B])."""
  rows = answer_rows(b["logprob_answer"], b["answer_mask"])
  ell = [sum(r) for r in rows]
  gid = b["group_id"] if group_size is None else np.arange(B) // group_size
  valid = valid_rows(b["response_mask"], gid, group_size=group_size,
                     extra=[bool(r) for r in rows])
  adv, w = np.zeros(B), np.zeros(B)
  for i in range(B):
    if not valid[i]:
      continue
    members = [j for j in range(B) if valid[j] and gid[j] == gid[i]]
    w[i] = math.exp(ell[i] - _lme([ell[j] for j in members]))  # n_g · softmax
    if len(members) < 2:
      continue
    adv[i] = reward_scale * (_lme([ell[j] for j in members])
                             - _lme([ell[j] for j in members if j != i]))
  return to_tokens(adv, b["response_mask"]), w


@functools.lru_cache(maxsize=None)
def jitted(group_size):
  return jax.jit(functools.partial(jepo.jepo_advantages, num_groups=N, group_size=group_size))


def test_registered():
  spec = registry.get_estimator("jepo")
  assert spec.family == "implicit" and spec.confidence == "inferred"
  assert "2503.19618" in spec.paper


def test_worked_example():
  # Expected: ℓ = [−0.35, −4.2]; L_2 = log((e^−0.35 + e^−4.2)/2); L_{−i} = the other ℓ.
  ans = np.array([[-0.2, -0.1, -0.05], [-1.5, -2.0, -0.7]], np.float32)
  out = jepo.jepo_advantages(group_id=np.zeros(2, np.int32),
                             response_mask=np.ones((2, 1), bool), logprob_answer=ans,
                             answer_mask=np.ones((2, 3), bool), num_groups=1)
  a = out.advantages
  l2 = math.log((math.exp(-0.35) + math.exp(-4.2)) / 2)
  np.testing.assert_allclose(np.asarray(a)[:, 0], [l2 + 4.2, l2 + 0.35], atol=1e-5)
  assert float(a[0, 0]) > 0 > float(a[1, 0])
  # Answer weights 2·softmax(ℓ) = 2·[0.97916, 0.02084].
  np.testing.assert_allclose(np.asarray(out.answer_weight), [1.95832, 0.04168], atol=1e-4)


def test_answer_term_is_the_gradient_of_the_bound():
  """On whole groups, ∇ answer_likelihood_loss(ℓ; w) = −∇ mean_groups L_G(ℓ): the weights
  n_g·softmax turn the bound's gradient through the answer tokens into a row mean, so a
  minibatch of whole rows takes its share of it."""
  rng = np.random.default_rng(0)
  lp = rng.uniform(-3.0, 0.0, (B, 3)).astype(np.float32)
  amask = np.ones((B, 3), bool)
  kw = dict(group_id=np.arange(B, dtype=np.int32) // G, response_mask=np.ones((B, T), bool),
            answer_mask=amask, num_groups=N)
  w = jepo.jepo_advantages(logprob_answer=lp, **kw).answer_weight
  got = jax.grad(lambda x: jepo.answer_likelihood_loss(
      logprob_answer=x, answer_mask=amask, answer_weight=w))(lp)
  bound = lambda x: jax.nn.logsumexp(x.sum(-1).reshape(N, G), axis=-1).mean()
  np.testing.assert_allclose(np.asarray(got), -np.asarray(jax.grad(bound)(lp)), atol=1e-6)


@pytest.mark.parametrize("group_size", [None, G])
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(group_size, data):
  b = data.draw(batches(contiguous=group_size is not None))
  kw = {k: b[k] for k in ("group_id", "response_mask", "logprob_answer", "answer_mask")}
  out = jitted(group_size)(**kw)
  adv, w = ref(b, group_size)
  np.testing.assert_allclose(np.asarray(out.advantages, np.float64), adv, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.answer_weight, np.float64), w, rtol=1e-4,
                             atol=1e-6)


def test_extreme_log_likelihoods_are_finite():
  lp = np.array([[0.0], [-500.0], [-800.0], [-800.0]], np.float32)
  out = jepo.jepo_advantages(group_id=np.zeros(4, np.int32),
                             response_mask=np.ones((4, T), bool), logprob_answer=lp,
                             answer_mask=np.ones((4, 1), bool), num_groups=1)
  a = np.asarray(out.advantages)
  assert np.all(np.isfinite(a)) and np.all(np.isfinite(np.asarray(out.answer_weight)))
  np.testing.assert_allclose(np.asarray(out.answer_weight), [4.0, 0.0, 0.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(a[0, 0], math.log(1 / 4) - (-500 + math.log(1 / 3)), rtol=1e-5)
  g = jax.grad(lambda x: jepo.jepo_advantages(
      group_id=np.zeros(4, np.int32), response_mask=np.ones((4, T), bool), logprob_answer=x,
      answer_mask=np.ones((4, 1), bool), num_groups=1).advantages.sum())(lp)
  assert np.all(np.isfinite(np.asarray(g)))
