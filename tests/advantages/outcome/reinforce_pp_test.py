"""REINFORCE++ and REINFORCE++-baseline (credit/advantages/outcome/reinforce_pp.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.advantages.outcome import (reinforce_pp_advantages,
                                       reinforce_pp_baseline_advantages)
from tests.advantages.outcome._harness import (B, BASE, Case, T, fixed_batch, grpo_rows,
                                               reference_test, token_x, valid_groups, whiten_np)


def ref_reinforce_pp(b, gamma=1.0, kl_coef=0.0, with_tr=False, whiten=True):
  mask = b["response_mask"]
  x = token_x(b, with_tr, kl_coef)
  ret = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    run = 0.0
    for t in reversed(range(mask.shape[1])):
      if mask[i, t]:                  # masked positions are skipped, not reset
        run = x[i, t] + gamma * run
        ret[i, t] = run
  return (whiten_np(ret, mask) if whiten else ret,)


def ref_reinforce_pp_baseline(b, singleton="zero"):
  s = grpo_rows(b, b["reward"].astype(np.float64), "none", 0.0, singleton)
  valid, _ = valid_groups(b)
  m = b["response_mask"] & valid[:, None]
  return (whiten_np(s[:, None] * np.ones((1, m.shape[1])), m),)


RPP = ("reward", "response_mask")
RPP_ALL = RPP + ("logprob_old", "logprob_ref", "token_reward")
CASES = [
    Case("reinforce_pp", "reinforce_pp", RPP, ref_reinforce_pp, group=False),
    Case("reinforce_pp_gamma", "reinforce_pp", RPP, ref_reinforce_pp, (("gamma", 0.9),),
         group=False, holes=True),
    Case("reinforce_pp_kl", "reinforce_pp", RPP_ALL, ref_reinforce_pp,
         (("gamma", 0.95), ("kl_coef", 0.1)), (("with_tr", True),), group=False, holes=True),
    Case("reinforce_pp_raw", "reinforce_pp", RPP_ALL, ref_reinforce_pp,
         (("kl_coef", 0.1), ("whiten", False)), (("with_tr", True),), group=False, holes=True),
    Case("reinforce_pp_baseline", "reinforce_pp_baseline", BASE, ref_reinforce_pp_baseline),
    Case("reinforce_pp_baseline_raw", "reinforce_pp_baseline", BASE, ref_reinforce_pp_baseline,
         (("singleton", "raw"),)),
]


test_matches_numpy_reference = reference_test(CASES)


def test_spec_example():
  # §4.6: γ = 1, rows (reward 1, length 2) and (reward 0, length 3): valid returns
  # {1, 1, 0, 0, 0}, m = 0.4, v = 0.3.
  m = np.array([[1, 1, 0], [1, 1, 1]], bool)
  a = reinforce_pp_advantages(reward=np.array([1., 0.], np.float32), response_mask=m)
  np.testing.assert_allclose(np.asarray(a), [[1.095445, 1.095445, 0], [-0.730297] * 3],
                             atol=1e-5)
  assert np.asarray(a)[0, 2] == 0.0


def test_observation_tokens_neither_add_nor_cut_the_return():
  # γ = 0.5, outcome 1 on the last token; the observation token (mask 0) is skipped:
  # G = [0.5², 0, 0.5, 1] over positions [0, obs, 2, 3].
  m = np.array([[1, 0, 1, 1]], bool)
  g = reinforce_pp_advantages(reward=np.array([1.], np.float32), response_mask=m, gamma=0.5,
                              whiten=False)
  np.testing.assert_allclose(np.asarray(g), [[0.25, 0.0, 0.5, 1.0]], atol=1e-7)


def test_closed_form_equals_scan():
  b = fixed_batch(seed=25, holes=True)
  zero_tr = np.zeros((B, T), np.float32)   # forces the generic scan path
  for gamma in (1.0, 0.9):
    fast = reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"],
                                   gamma=gamma)
    scan = reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"],
                                   token_reward=zero_tr, gamma=gamma)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(scan), rtol=1e-5, atol=1e-6)
  # A traced gamma takes the closed form γ^(tokens after t); at γ=1 it equals the O(B) path.
  traced = jax.jit(lambda g: reinforce_pp_advantages(
      reward=b["reward"], response_mask=b["response_mask"], gamma=g))(jnp.float32(1.0))
  python_one = reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"])
  np.testing.assert_allclose(np.asarray(traced), np.asarray(python_one), rtol=1e-5, atol=1e-6)


def test_static_one_fast_path_equals_general_path():
  # Python 1.0 takes the reverse-cumsum path; a traced 1.0 the scan.
  b = fixed_batch(seed=26, holes=True)
  kw = dict(reward=b["reward"], response_mask=b["response_mask"],
            logprob_old=b["logprob_old"], logprob_ref=b["logprob_ref"],
            token_reward=b["token_reward"], kl_coef=0.1)
  fast = reinforce_pp_advantages(**kw)
  slow = jax.jit(lambda g: reinforce_pp_advantages(**kw, gamma=g))(jnp.float32(1.0))
  np.testing.assert_allclose(np.asarray(fast), np.asarray(slow), rtol=1e-5, atol=1e-5)


def test_kl_without_logprobs_raises():
  b = fixed_batch()
  with pytest.raises(ValueError, match="needs logprob_old and logprob_ref"):
    reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"], kl_coef=0.1)
  with pytest.raises(ValueError, match="pass both"):
    reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"],
                            logprob_ref=b["logprob_ref"])


def test_baseline_bad_singleton_raises():
  b = fixed_batch()
  with pytest.raises(ValueError, match="singleton"):
    reinforce_pp_baseline_advantages(reward=b["reward"], group_id=b["group_id"],
                                     response_mask=b["response_mask"], num_groups=4,
                                     singleton="drop")
