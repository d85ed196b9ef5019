"""Tests for VIMPO (credit/advantages/implicit/vimpo.py); spec §14. Float64 loop reference
from the formulas; registry-wide properties in tests/registry_common_test.py."""
from __future__ import annotations

import doctest
import functools

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.implicit import vimpo as vm

N, G, T = 4, 4, 6
B = N * G


def ref(reward, gid, mask, lp, lpref, beta=0.1, clip=10.0, group_size=None):
  gid = np.arange(B) // group_size if group_size is not None else gid
  valid = [bool(mask[b].any()) and (group_size is not None or 0 <= gid[b] < N)
           for b in range(B)]
  adv = np.zeros((B, T))
  val = np.zeros((B, T))
  losses = []
  for b in range(B):
    if not valid[b]:
      continue
    members = [float(reward[j]) for j in range(B) if valid[j] and gid[j] == gid[b]]
    base = sum(members) / len(members)
    run = 0.0
    for t in range(T):
      if not mask[b, t]:
        continue
      v = base + min(max(beta * run, -clip), clip)
      val[b, t] = v
      adv[b, t] = reward[b] - v
      run += float(lp[b, t]) - float(lpref[b, t])
    losses.append((min(max(beta * run, -clip), clip) + base - reward[b]) ** 2)
  return adv, (sum(losses) / len(losses) if losses else 0.0), val


@st.composite
def batches(draw, contiguous=False):
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):
    mask &= rng.random((B, T)) > 0.3
  gid = (np.arange(B) // G if contiguous else rng.integers(-1, N + 1, B)).astype(np.int32)
  reward = rng.choice([0.0, 1.0, 0.5], B).astype(np.float32)
  scale = draw(st.sampled_from([1.0, 60.0]))       # 60: the clip binds
  lp = (rng.normal(size=(B, T)) * scale).astype(np.float32)
  lpref = (rng.normal(size=(B, T))).astype(np.float32)
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob=lp, logprob_ref=lpref)


@functools.lru_cache(maxsize=None)
def jitted(group_size):
  return jax.jit(functools.partial(vm.vimpo_advantages, num_groups=N, group_size=group_size))


def test_registered_and_doctest():
  spec = registry.get_estimator("vimpo")
  assert spec.family == "implicit" and spec.confidence == "inferred" and spec.returns_output
  assert spec.needs == {"reward", "group_id", "response_mask", "logprob", "logprob_ref"}
  res = doctest.testmod(vm, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  out = vm.vimpo_advantages(reward=np.array([1., 0.], np.float32),
                            group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 3), bool),
                            logprob=np.array([[.5, -.2, .1], [-.3, 0., .2]], np.float32),
                            logprob_ref=np.zeros((2, 3), np.float32), num_groups=1)
  np.testing.assert_allclose(np.asarray(out.values), [[0.5, 0.55, 0.53], [0.5, 0.47, 0.47]],
                             atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.advantages),
                             [[0.5, 0.45, 0.47], [-0.5, -0.47, -0.47]], atol=1e-4)
  np.testing.assert_allclose(float(out.value_loss), 0.22585, atol=1e-5)


@pytest.mark.parametrize("group_size", [None, G])
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(group_size, data):
  b = data.draw(batches(contiguous=group_size is not None))
  out = jitted(group_size)(**b)
  adv, loss, val = ref(b["reward"], b["group_id"], b["response_mask"], b["logprob"],
                       b["logprob_ref"], group_size=group_size)
  np.testing.assert_allclose(np.asarray(out.advantages), adv, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.values), val, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(float(out.value_loss), loss, rtol=1e-4, atol=1e-5)


def test_reduces_to_grpo_centring_when_policy_is_reference():
  # ℓ = 0: V = b_g, A = R − b_g (Dr.GRPO's centred reward), L_V = mean (b_g − R)².
  rng = np.random.default_rng(0)
  lp = rng.normal(size=(B, T)).astype(np.float32)
  reward = rng.choice([0., 1.], B).astype(np.float32)
  out = vm.vimpo_advantages(reward=reward, group_id=(np.arange(B) // G).astype(np.int32),
                            response_mask=np.ones((B, T), bool), logprob=lp, logprob_ref=lp,
                            num_groups=N)
  mu = reward.reshape(N, G).mean(1).repeat(G)
  np.testing.assert_allclose(np.asarray(out.advantages), np.tile((reward - mu)[:, None], T),
                             atol=1e-6)
  np.testing.assert_allclose(float(out.value_loss), np.mean((mu - reward) ** 2), atol=1e-6)


def test_value_loss_gradient_flows_into_logprob_only():
  rng = np.random.default_rng(1)
  mask = np.ones((B, T), bool)
  mask[2, 3:] = False
  kw = dict(reward=rng.choice([0., 1.], B).astype(np.float32),
            group_id=(np.arange(B) // G).astype(np.int32), response_mask=mask, num_groups=N)
  lp = jnp.asarray(rng.normal(size=(B, T)).astype(np.float32))
  ref = jnp.asarray(rng.normal(size=(B, T)).astype(np.float32))
  g_lp, g_ref = jax.grad(lambda a, r: vm.vimpo_advantages(logprob=a, logprob_ref=r,
                                                          **kw).value_loss,
                         argnums=(0, 1))(lp, ref)
  assert np.all(np.asarray(g_ref) == 0.0) and np.all(np.asarray(g_lp)[~mask] == 0.0)
  assert np.any(np.asarray(g_lp) != 0.0)
  g_adv = jax.grad(lambda a: vm.vimpo_advantages(logprob=a, logprob_ref=ref,
                                                 **kw).advantages.sum())(lp)
  assert np.all(np.asarray(g_adv) == 0.0)


def test_bad_args_raise():
  kw = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
            response_mask=np.ones((B, T), bool), logprob=np.zeros((B, T), np.float32))
  with pytest.raises(AssertionError):
    vm.vimpo_advantages(logprob_ref=np.zeros((B, T + 1), np.float32), num_groups=N, **kw)
  with pytest.raises(ValueError, match="num_groups"):
    vm.vimpo_advantages(logprob_ref=np.zeros((B, T), np.float32), num_groups=0, **kw)
