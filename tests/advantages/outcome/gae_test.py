"""GAE (credit/advantages/outcome/gae.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.advantages.outcome import gae_advantages
from tests.advantages.outcome._harness import Case, fixed_batch, reference_test, token_x, whiten_np


def ref_gae(b, gamma=1.0, lam=1.0, kl_coef=0.0, with_tr=False, whiten=True):
  mask = b["response_mask"]
  v = b["values"].astype(np.float64)
  x = token_x(b, with_tr, kl_coef)
  adv = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    nextv, last = 0.0, 0.0
    for t in reversed(range(mask.shape[1])):
      if mask[i, t]:
        delta = x[i, t] + gamma * nextv - v[i, t]
        last = delta + gamma * lam * last
        nextv = v[i, t]
        adv[i, t] = last
  returns = np.where(mask, adv + v, 0.0)
  return (whiten_np(adv, mask) if whiten else adv, returns)


GAE = ("reward", "values", "response_mask")
GAE_ALL = GAE + ("logprob_old", "logprob_ref", "token_reward")
CASES = [
    Case("gae", "gae", GAE, ref_gae, (("gamma", 0.99), ("lam", 0.95)), group=False),
    Case("gae_telescoped", "gae", GAE, ref_gae, group=False),
    Case("gae_telescoped_kl", "gae", GAE_ALL, ref_gae, (("kl_coef", 0.05),),
         (("with_tr", True),), group=False, holes=True),
    Case("gae_kl_raw", "gae", GAE_ALL, ref_gae,
         (("lam", 0.9), ("kl_coef", 0.05), ("whiten", False)), (("with_tr", True),),
         group=False, holes=True),
]


test_matches_numpy_reference = reference_test(CASES)


def test_spec_example():
  # §5.6: r = [0, 0, 1], V = [0.5, 0.6, 0.8], γ = 1, λ = 0.95 (before whitening).
  out = gae_advantages(reward=np.array([1.], np.float32),
                       values=np.array([[0.5, 0.6, 0.8]], np.float32),
                       response_mask=np.ones((1, 3), bool), gamma=1.0, lam=0.95, whiten=False)
  np.testing.assert_allclose(np.asarray(out.advantages), [[0.4705, 0.39, 0.2]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(out.returns), [[0.9705, 0.99, 1.0]], atol=1e-6)


def test_observation_tokens_are_skipped():
  # An observation token (mask 0) between the two policy tokens carries V and Â through.
  out = gae_advantages(reward=np.array([1.], np.float32),
                       values=np.array([[0.5, 99., 0.8]], np.float32),
                       response_mask=np.array([[1, 0, 1]], bool), lam=0.5, whiten=False)
  # δ_2 = 1 − 0.8 = 0.2; δ_0 = 0 + 0.8 − 0.5 = 0.3; Â_0 = 0.3 + 0.5·0.2 = 0.4.
  np.testing.assert_allclose(np.asarray(out.advantages), [[0.4, 0.0, 0.2]], atol=1e-6)


def test_static_one_fast_path_equals_general_path():
  # Python γ = λ = 1 takes the telescoped path; traced 1.0s the scans.
  b = fixed_batch(seed=26, holes=True)
  kw = dict(reward=b["reward"], values=b["values"], response_mask=b["response_mask"],
            logprob_old=b["logprob_old"], logprob_ref=b["logprob_ref"],
            token_reward=b["token_reward"], kl_coef=0.1)
  one = jnp.float32(1.0)
  fast = gae_advantages(**kw)
  slow = jax.jit(lambda g, l: gae_advantages(**kw, gamma=g, lam=l))(one, one)
  for f_, s_ in zip(fast, slow):
    np.testing.assert_allclose(np.asarray(f_), np.asarray(s_), rtol=1e-5, atol=1e-5)


def test_one_logprob_without_the_other_raises():
  b = fixed_batch()
  with pytest.raises(ValueError, match="pass both"):
    gae_advantages(reward=b["reward"], values=b["values"], response_mask=b["response_mask"],
                   logprob_old=b["logprob_old"])
