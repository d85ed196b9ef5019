"""CSO step-DPO and InT intervention SFT (credit/losses/preference.py)."""
from __future__ import annotations

import doctest
import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.losses import preference as pref

B, T, P = 6, 7, 4


def softplus(x):
  return np.logaddexp(0.0, x)


@functools.lru_cache(maxsize=None)
def jitted_pair_loss(beta=0.1):
  def f(lp, ref, mask, ci, ri):
    s = pref.dpo_pair_logprobs(logprob=lp, logprob_ref=ref, token_mask=mask, chosen_row=ci,
                               rejected_row=ri)
    return pref.dpo_pair_loss(logprob_chosen=s.chosen, logprob_ref_chosen=s.ref_chosen,
                              logprob_rejected=s.rejected, logprob_ref_rejected=s.ref_rejected,
                              pair_mask=s.valid, beta=beta)
  return jax.jit(f)


@functools.lru_cache(maxsize=None)
def jitted_sft(train_on):
  return jax.jit(lambda lp, p, n: pref.intervention_sft_loss(
      logprob=lp, loss_mask=pref.intervention_sft_mask(p, n, T, train_on=train_on)))


def make_pairs(seed):
  rng = np.random.default_rng(seed)
  lp = rng.uniform(-3, -0.05, (B, T)).astype(np.float32)
  ref = rng.uniform(-3, -0.05, (B, T)).astype(np.float32)
  prefix = rng.integers(0, 4, B)
  length = rng.integers(0, T + 1, B)
  t = np.arange(T)[None, :]
  mask = (t >= prefix[:, None]) & (t < length[:, None])     # step tokens: prefix is context
  ci = rng.integers(-1, B, P).astype(np.int32)
  ri = rng.integers(0, B, P).astype(np.int32)
  return lp, ref, mask, ci, ri


def ref_pair_loss(lp, ref, mask, ci, ri, beta=0.1):
  terms = []
  for c, r in zip(ci, ri):
    if not (0 <= c < B and 0 <= r < B and mask[c].any() and mask[r].any()):
      continue
    lc, lrc = lp[c][mask[c]].sum(), ref[c][mask[c]].sum()
    lr, lrr = lp[r][mask[r]].sum(), ref[r][mask[r]].sum()
    terms.append(softplus(-beta * ((lc - lrc) - (lr - lrr))))
  return float(np.mean(terms)) if terms else 0.0


def test_doctests():
  res = doctest.testmod(pref, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example_dpo():
  # lc=−5, lrc=−6, lr=−4, lrr=−3.5 -> z = 0.15, loss = softplus(−0.15) = 0.620957.
  out = pref.dpo_pair_loss(logprob_chosen=np.array([-5.0]), logprob_ref_chosen=np.array([-6.0]),
                           logprob_rejected=np.array([-4.0]),
                           logprob_ref_rejected=np.array([-3.5]))
  np.testing.assert_allclose(float(out.loss), 0.620957, atol=1e-6)
  assert float(out.metrics["dpo_pair_accuracy"]) == 1.0
  np.testing.assert_allclose(float(out.metrics["dpo_margin_mean"]), 1.5, rtol=1e-6)


def test_spec_example_intervention_mask():
  m = pref.intervention_sft_mask(np.array([3, 0]), np.array([2, 1]), 7)
  assert np.asarray(m).astype(int).tolist() == [[1, 1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0, 0]]
  m = pref.intervention_sft_mask(np.array([3]), np.array([2]), 7, train_on="intervention_only")
  assert np.asarray(m).astype(int).tolist() == [[0, 0, 0, 1, 1, 0, 0]]
  rm = np.array([[0, 1, 1, 1, 1, 1, 1]], bool)                  # column 0 is the prompt
  m = pref.intervention_sft_mask(np.array([3]), np.array([2]), 7, response_mask=rm)
  assert np.asarray(m).astype(int).tolist() == [[0, 1, 1, 1, 1, 0, 0]]
  with pytest.raises(ValueError, match="train_on"):
    pref.intervention_sft_mask(np.array([3]), np.array([2]), 7, train_on="prefix")
  with pytest.raises(ValueError, match="seq_len"):
    pref.intervention_sft_mask(np.array([3]), np.array([2]), 0)


@hypothesis.settings(max_examples=15)
@hypothesis.given(seed=st.integers(0, 10_000), beta=st.sampled_from([0.1, 0.5]))
def test_pair_loss_matches_numpy_reference(seed, beta):
  lp, ref, mask, ci, ri = make_pairs(seed)
  out = jitted_pair_loss(beta)(lp, ref, mask, ci, ri)
  np.testing.assert_allclose(float(out.loss), ref_pair_loss(lp, ref, mask, ci, ri, beta),
                             rtol=1e-5, atol=1e-6)


def test_pair_sums_prefix_is_context_only_and_gradients():
  lp, ref, mask, _, _ = make_pairs(1)
  ci, ri = np.array([0, 2], np.int32), np.array([1, 3], np.int32)
  mask[:4, :] = False
  mask[:4, 3:6] = True
  # Changing the prefix (masked) log-probs, even to NaN, changes nothing.
  lp2 = np.where(mask, lp, np.nan).astype(np.float32)
  f = jitted_pair_loss()
  np.testing.assert_allclose(float(f(lp2, ref, mask, ci, ri).loss),
                             float(f(lp, ref, mask, ci, ri).loss), rtol=1e-6)
  grad = jax.grad(lambda x: f(x, ref, mask, ci, ri).loss)(lp2)
  g = np.asarray(grad)
  assert np.all(np.isfinite(g)) and np.all(g[~mask] == 0)
  # d loss / d lc = −β σ(−z) / P on the chosen step tokens; the rejected side has the
  # opposite sign; no gradient through the reference.
  s = pref.dpo_pair_logprobs(logprob=lp, logprob_ref=ref, token_mask=mask, chosen_row=ci,
                             rejected_row=ri)
  z = 0.1 * ((np.asarray(s.chosen) - np.asarray(s.ref_chosen))
             - (np.asarray(s.rejected) - np.asarray(s.ref_rejected)))
  w = -0.1 / (1 + np.exp(z)) / 2
  np.testing.assert_allclose(g[0, 3:6], w[0], rtol=1e-5)
  np.testing.assert_allclose(g[1, 3:6], -w[0], rtol=1e-5)
  np.testing.assert_allclose(g[2, 3:6], w[1], rtol=1e-5)
  gref = jax.grad(lambda x: f(lp, x, mask, ci, ri).loss)(ref)
  assert np.all(np.asarray(gref) == 0)


def test_pair_loss_degenerate():
  out = pref.dpo_pair_loss(logprob_chosen=np.zeros(3), logprob_ref_chosen=np.zeros(3),
                           logprob_rejected=np.zeros(3), logprob_ref_rejected=np.zeros(3),
                           pair_mask=np.zeros(3, bool))
  assert float(out.loss) == 0.0 and float(out.metrics["dpo_num_pairs"]) == 0.0
  out = pref.dpo_pair_loss(logprob_chosen=np.zeros(2), logprob_ref_chosen=np.zeros(2),
                           logprob_rejected=np.zeros(2), logprob_ref_rejected=np.zeros(2))
  np.testing.assert_allclose(float(out.loss), np.log(2.0), rtol=1e-6)   # z = 0
  with pytest.raises(AssertionError):
    pref.dpo_pair_loss(logprob_chosen=np.zeros(2), logprob_ref_chosen=np.zeros(3),
                       logprob_rejected=np.zeros(2), logprob_ref_rejected=np.zeros(2))


@hypothesis.settings(max_examples=10)
@hypothesis.given(seed=st.integers(0, 10_000),
                  train_on=st.sampled_from(pref.SFT_TARGETS))
def test_sft_loss_reference_jit_and_gradient(seed, train_on):
  rng = np.random.default_rng(seed)
  lp = rng.uniform(-4, -0.01, (B, T)).astype(np.float32)
  p, n = rng.integers(0, T, B), rng.integers(0, 3, B)
  f = jitted_sft(train_on)
  out = f(lp, p, n)
  t = np.arange(T)[None, :]
  m = t < (p + n)[:, None]
  if train_on == "intervention_only":
    m &= t >= p[:, None]
  want = -lp[m].sum() / max(m.sum(), 1)
  np.testing.assert_allclose(float(out.loss), want, rtol=1e-5)
  assert float(out.metrics["sft_tokens"]) == m.sum()
  eager = pref.intervention_sft_loss(logprob=lp, loss_mask=m)
  np.testing.assert_allclose(float(eager.loss), float(out.loss), rtol=1e-6)
  g = np.asarray(jax.grad(lambda x: f(x, p, n).loss)(lp))
  np.testing.assert_allclose(g, np.where(m, -1.0 / max(m.sum(), 1), 0.0), rtol=1e-6)


def test_sft_loss_empty_mask_and_nan_outside():
  lp = jnp.full((2, 3), jnp.nan)
  out = pref.intervention_sft_loss(logprob=lp, loss_mask=jnp.zeros((2, 3), bool))
  assert float(out.loss) == 0.0
  g = jax.grad(lambda x: pref.intervention_sft_loss(
      logprob=x, loss_mask=jnp.zeros((2, 3), bool)).loss)(lp)
  assert np.all(np.asarray(g) == 0)
