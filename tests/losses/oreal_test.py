"""OREAL policy loss and token-RM loss (credit/losses/oreal.py)."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from credit import losses
from credit.registry import get_policy_loss

B, T = 6, 5


def _batch(seed):
  rng = np.random.default_rng(seed)
  old = -np.abs(rng.normal(size=(B, T))).astype(np.float32) - 0.05
  lp = (old + 0.3 * rng.normal(size=(B, T))).astype(np.float32)
  ref = (old + 0.3 * rng.normal(size=(B, T))).astype(np.float32)
  adv = rng.normal(size=(B, T)).astype(np.float32)
  lengths = rng.integers(0, T + 1, B)
  lengths[:2] = T
  mask = np.arange(T)[None, :] < lengths[:, None]
  reward = np.array([1.0, -1.0] * (B // 2), np.float32)
  return dict(logprob=lp, logprob_old=old, advantages=adv, response_mask=mask,
              reward=reward, logprob_ref=ref)


def ref_loss(b, fp=1.0, fn=0.5, beta=0.01):
  m, r = b["response_mask"], b["reward"]
  lp, a, ref = (b[k].astype(np.float64) for k in ("logprob", "advantages", "logprob_ref"))
  pos = m & (r > 0)[:, None]
  neg = m & ~pos
  n_pos, n_neg, n = max(pos.sum(), 1), max(neg.sum(), 1), max(m.sum(), 1)
  loss, grad = 0.0, np.zeros((B, T))
  for i in range(B):
    for t in range(T):
      if not m[i, t]:
        continue
      x = ref[i, t] - lp[i, t]
      k3 = min(max(math.exp(x) - x - 1, -10), 10)
      if pos[i, t]:
        loss += -lp[i, t] * a[i, t] * fp / n_pos
        grad[i, t] = -a[i, t] * fp / n_pos
      else:
        loss += -a[i, t] * fn / n_neg
        grad[i, t] = -a[i, t] * fn / n_neg
      loss += beta * k3 / n
      grad[i, t] += beta * (1 - math.exp(x)) / n
  return loss, grad


@functools.lru_cache(maxsize=None)
def _program():
  fn = get_policy_loss("oreal").fn
  return jax.jit(jax.value_and_grad(lambda lp, b: fn(**dict(b, logprob=lp)).loss))


def test_hand_example():
  # One positive row (A = 4/3, log π = -0.5) and one negative row (A = -4/3), one token each,
  # no reference: L = 1·(0.5·4/3)/1 - 0.5·(-4/3)/1 = 2/3 + 2/3.
  b = dict(logprob=np.array([[-0.5], [-2.0]], np.float32),
           logprob_old=np.array([[-0.5], [-2.0]], np.float32),
           advantages=np.array([[4 / 3], [-4 / 3]], np.float32),
           response_mask=np.ones((2, 1), bool), reward=np.array([1.0, -1.0], np.float32))
  out = get_policy_loss("oreal").fn(**b)
  np.testing.assert_allclose(out.loss, 4 / 3, atol=1e-5)
  g = jax.grad(lambda lp: get_policy_loss("oreal").fn(**dict(b, logprob=lp)).loss)(
      b["logprob"])
  np.testing.assert_allclose(g, [[-4 / 3], [0.5 * 4 / 3]], atol=1e-5)
  assert float(out.metrics["pos_frac"]) == 0.5


def test_matches_numpy_value_and_gradient():
  for seed in (0, 1):
    b = _batch(seed)
    loss, g = _program()(b["logprob"], b)
    want, want_g = ref_loss(b)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, want_g, rtol=1e-4, atol=1e-6)


def test_microbatches_with_global_counts_sum_to_the_batch():
  b = _batch(2)
  fn = get_policy_loss("oreal").fn
  m, r = b["response_mask"], b["reward"]
  glob = dict(pos_tokens_global=(m & (r > 0)[:, None]).sum(),
              neg_tokens_global=(m & (r <= 0)[:, None]).sum(), kl_tokens_global=m.sum())
  full = fn(**b).loss
  parts = sum(fn(**{k: v[i:i + 2] for k, v in b.items()}, **glob).loss for i in range(0, B, 2))
  np.testing.assert_allclose(parts, full, rtol=1e-5, atol=1e-6)


def test_token_rm_loss():
  z = np.array([[2.0, 0.0, 9.0], [-1.0, -3.0, 0.0], [5.0, 5.0, 5.0]], np.float32)
  m = np.array([[True, True, False], [True, True, True], [False] * 3])
  r = np.array([1.0, -1.0, 1.0], np.float32)
  got = losses.oreal_token_rm_loss(token_rm_logit=z, response_mask=m, reward=r)
  sp = lambda x: math.log1p(math.exp(x))
  np.testing.assert_allclose(got, (sp(1.0) - 1.0 + sp(-4 / 3)) / 2, rtol=1e-6)
  g = jax.grad(lambda x: losses.oreal_token_rm_loss(token_rm_logit=x, response_mask=m,
                                                    reward=r))(jnp.asarray(z))
  assert np.all(np.asarray(g)[~m] == 0.0)
  assert losses.oreal_token_rm_loss(token_rm_logit=z, response_mask=np.zeros_like(m),
                                    reward=r) == 0.0
