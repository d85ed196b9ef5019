"""Tests for VIMPO (credit/advantages/implicit/vimpo.py).

Source: the HF TRL port `trl/experimental/vimpo/vimpo_trainer.py` (arXiv 2606.20008). The
float64 loop reference is written from its formulas (terminal value loss, reverse λ-sum of
ρ − κ, population-std whitening over the batch); registry-wide properties in
tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools
import math

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

# Worked example (β = 0.1, two rows of a group, π_ref = 0.5 everywhere), computed with numpy
# from the port's formulas:
#   ℓ = logprob − log 0.5, ρ = β ℓ, κ = 0.1 β (token_kl) or β(e^{−ℓ} − 1 + ℓ) (k3),
#   A_t = Σ_{s≥t} (ρ_s − κ_s), whitened with the population std over the 6 tokens,
#   L_V = ½ mean_b (Σ_t (ρ − κ) − (R − mean R))².
EX = dict(reward=np.array([1., 0.], np.float32), group_id=np.zeros(2, np.int32),
          response_mask=np.ones((2, 3), bool),
          logprob=np.array([[-.5, -.2, -.1], [-.3, -1., -.2]], np.float32),
          logprob_ref=np.log(np.full((2, 3), 0.5, np.float32)), beta=0.1, num_groups=1)
EX_KL_ADV = [[1.3920, 1.1199, -0.0287], [-0.6530, -1.5094, -0.3208]]
EX_KL_LOSS = 0.1100935
# k3: δ = β(1 − e^{−ℓ}) = [[0.01756, 0.03893, 0.04474], [0.03251, −0.03591, 0.03893]].
EX_K3_ADV = [[1.5424, 1.0011, -0.1986], [-0.4827, -1.4845, -0.3777]]
EX_K3_LOSS = 0.1114495
EX_K3_VALUES = [[0.5, 0.51756, 0.55649], [0.5, 0.53251, 0.49659]]


def ref(reward, gid, mask, lp, lpref, *, beta=5e-4, gae_lambda=1.0, clip=None,
        kl_estimate="k3", token_kl=None, group_size=None):
  gid = np.arange(B) // group_size if group_size is not None else gid
  valid = [bool(mask[b].any()) and (group_size is not None or 0 <= gid[b] < N)
           for b in range(B)]
  bound = (lambda x: x) if clip is None else (lambda x: min(max(x, -clip), clip))
  delta = np.zeros((B, T))
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
      ell = float(lp[b, t]) - float(lpref[b, t])
      if token_kl is not None:
        kappa = beta * float(token_kl[b, t])
      elif kl_estimate == "k3":
        kappa = beta * (math.exp(-ell) - 1 + ell)
      else:
        kappa = 0.0
      delta[b, t] = beta * ell - kappa
      val[b, t] = base + bound(run)
      run += delta[b, t]
    losses.append(0.5 * (bound(run) - (reward[b] - base)) ** 2)
  adv = np.zeros((B, T))
  for b in range(B):
    acc = 0.0
    for t in reversed(range(T)):
      if mask[b, t] and valid[b]:
        acc = delta[b, t] + gae_lambda * acc
        adv[b, t] = acc
  sel = np.array([[mask[b, t] and valid[b] for t in range(T)] for b in range(B)])
  if sel.sum() > 1:
    x = adv[sel]
    adv = np.where(sel, (adv - x.mean()) / (x.std() + 1e-8), 0.0)
  else:
    adv = np.zeros((B, T))
  return adv, (sum(losses) / len(losses) if losses else 0.0), val


CONFIGS = {
    "default": dict(),
    "beta_lambda": dict(beta=0.05, gae_lambda=0.9),
    "clip": dict(beta=1.0, clip=2.0),
    "no_kappa": dict(beta=0.1, kl_estimate="none"),
    "kl_ref": dict(beta=0.1, token_kl=True, exact_kl=True),
}


@st.composite
def batches(draw, contiguous=False):
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):
    mask &= rng.random((B, T)) > 0.3
  gid = (np.arange(B) // G if contiguous else rng.integers(-1, N + 1, B)).astype(np.int32)
  reward = rng.choice([0.0, 1.0, 0.5], B).astype(np.float32)
  lp = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  lpref = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  kl = rng.uniform(0, 2, (B, T)).astype(np.float32)
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob=lp, logprob_ref=lpref,
              token_kl=kl)


@functools.lru_cache(maxsize=None)
def jitted(name, group_size):
  cfg = {k: v for k, v in CONFIGS[name].items() if k != "token_kl"}
  return jax.jit(functools.partial(vm.vimpo_advantages, num_groups=N, group_size=group_size,
                                   **cfg))


def test_registered_and_doctest():
  spec = registry.get_estimator("vimpo")
  assert spec.family == "implicit" and spec.confidence == "code-verified"
  assert spec.returns_output
  assert spec.needs == {"reward", "group_id", "response_mask", "logprob", "logprob_ref"}
  assert "2606.20008" in spec.paper
  res = doctest.testmod(vm, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  out = vm.vimpo_advantages(kl_ref=np.full((2, 3), 0.1, np.float32), **EX)
  np.testing.assert_allclose(np.asarray(out.advantages), EX_KL_ADV, atol=1e-3)
  np.testing.assert_allclose(float(out.value_loss), EX_KL_LOSS, rtol=1e-5)
  out = vm.vimpo_advantages(**EX)
  np.testing.assert_allclose(np.asarray(out.advantages), EX_K3_ADV, atol=1e-3)
  np.testing.assert_allclose(float(out.value_loss), EX_K3_LOSS, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(out.values), EX_K3_VALUES, atol=1e-5)


def test_port_defaults():
  import inspect
  sig = inspect.signature(vm.vimpo_advantages).parameters
  assert sig["beta"].default == 5e-4 and sig["gae_lambda"].default == 1.0
  assert sig["clip"].default is None


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("group_size", [None, G])
@hypothesis.settings(max_examples=10)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, group_size, data):
  b = data.draw(batches(contiguous=group_size is not None))
  cfg = dict(CONFIGS[name])
  kl = b.pop("token_kl")
  use_kl = cfg.pop("token_kl", False)
  cfg.pop("exact_kl", None)
  out = jitted(name, group_size)(**b, **(dict(kl_ref=kl) if use_kl else {}))
  adv, loss, val = ref(b["reward"], b["group_id"], b["response_mask"], b["logprob"],
                       b["logprob_ref"], group_size=group_size, **cfg,
                       token_kl=kl if use_kl else None)
  np.testing.assert_allclose(np.asarray(out.advantages), adv, rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(np.asarray(out.values), val, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(float(out.value_loss), loss, rtol=1e-4, atol=1e-6)


def test_policy_equal_to_reference():
  # ℓ = 0 (and κ = 0): no implied credit, A = 0, V = b_g, L_V = ½ mean (R − b_g)².
  rng = np.random.default_rng(0)
  lp = rng.normal(size=(B, T)).astype(np.float32)
  reward = rng.choice([0., 1.], B).astype(np.float32)
  out = vm.vimpo_advantages(reward=reward, group_id=(np.arange(B) // G).astype(np.int32),
                            response_mask=np.ones((B, T), bool), logprob=lp, logprob_ref=lp,
                            num_groups=N)
  mu = reward.reshape(N, G).mean(1).repeat(G)
  assert np.all(np.asarray(out.advantages) == 0.0)
  np.testing.assert_allclose(np.asarray(out.values), np.tile(mu[:, None], T), atol=1e-6)
  np.testing.assert_allclose(float(out.value_loss), 0.5 * np.mean((mu - reward) ** 2),
                             atol=1e-6)


def test_reward_enters_only_through_the_value_loss():
  rng = np.random.default_rng(2)
  kw = dict(group_id=(np.arange(B) // G).astype(np.int32), response_mask=np.ones((B, T), bool),
            logprob=rng.uniform(-3, 0, (B, T)).astype(np.float32),
            logprob_ref=rng.uniform(-3, 0, (B, T)).astype(np.float32), num_groups=N)
  a = vm.vimpo_advantages(reward=np.zeros(B, np.float32), **kw)
  b = vm.vimpo_advantages(reward=rng.normal(size=B).astype(np.float32), **kw)
  np.testing.assert_array_equal(np.asarray(a.advantages), np.asarray(b.advantages))
  assert float(a.value_loss) != float(b.value_loss)


def test_value_loss_gradient_flows_into_logprob_only():
  rng = np.random.default_rng(1)
  mask = np.ones((B, T), bool)
  mask[2, 3:] = False
  kw = dict(reward=rng.choice([0., 1.], B).astype(np.float32),
            group_id=(np.arange(B) // G).astype(np.int32), response_mask=mask, num_groups=N,
            beta=0.1)
  lp = jnp.asarray(rng.uniform(-3, 0, (B, T)).astype(np.float32))
  ref = jnp.asarray(rng.uniform(-3, 0, (B, T)).astype(np.float32))
  g_lp, g_ref = jax.grad(lambda a, r: vm.vimpo_advantages(logprob=a, logprob_ref=r,
                                                          **kw).value_loss,
                         argnums=(0, 1))(lp, ref)
  assert np.all(np.asarray(g_ref) == 0.0) and np.all(np.asarray(g_lp)[~mask] == 0.0)
  assert np.any(np.asarray(g_lp) != 0.0)
  # d L_V / d logprob_t = β · residual_b / B (κ carries no gradient).
  ell = np.where(mask, np.asarray(lp) - np.asarray(ref), 0.0)
  d = 0.1 * (1 - np.exp(-ell)) * mask
  r = np.asarray(kw["reward"])
  resid = d.sum(1) - (r - r.reshape(N, G).mean(1).repeat(G))
  np.testing.assert_allclose(np.asarray(g_lp), np.where(mask, 0.1 * resid[:, None] / B, 0.0),
                             rtol=1e-4, atol=1e-7)
  g_adv = jax.grad(lambda a: vm.vimpo_advantages(logprob=a, logprob_ref=ref,
                                                 **kw).advantages.sum())(lp)
  assert np.all(np.asarray(g_adv) == 0.0)


def test_minibatch_value_loss_from_the_batch_targets():
  """`vimpo_value_loss` (what the runner adds on each minibatch) with the whole batch's
  `value_target` equals the estimator's `value_loss`, and on a subset of rows is the mean of
  their squared residuals, with the same gradient per row up to the row count."""
  rng = np.random.default_rng(3)
  mask = np.ones((B, T), bool)
  mask[5, 2:] = False
  reward = rng.choice([0., 1.], B).astype(np.float32)
  lp = jnp.asarray(rng.uniform(-3, 0, (B, T)).astype(np.float32))
  ref = jnp.asarray(rng.uniform(-3, 0, (B, T)).astype(np.float32))
  out = vm.vimpo_advantages(reward=reward, group_id=(np.arange(B) // G).astype(np.int32),
                            response_mask=mask, logprob=lp, logprob_ref=ref, num_groups=N,
                            beta=0.1)
  np.testing.assert_allclose(np.asarray(out.value_target),
                             reward - reward.reshape(N, G).mean(1).repeat(G), atol=1e-6)
  loss = functools.partial(vm.vimpo_value_loss, logprob_ref=ref, beta=0.1)
  whole = loss(logprob=lp, response_mask=mask, value_target=out.value_target)
  np.testing.assert_allclose(float(whole), float(out.value_loss), rtol=1e-6)
  rows = np.array([1, 5, 6, 12])  # rows of three groups, as a shuffled minibatch holds
  sub = vm.vimpo_value_loss(logprob=lp[rows], logprob_ref=ref[rows], response_mask=mask[rows],
                            value_target=out.value_target[rows], beta=0.1)
  ell = np.where(mask, np.asarray(lp) - np.asarray(ref), 0.0)
  resid = (0.1 * (1 - np.exp(-ell)) * mask).sum(1) - np.asarray(out.value_target)
  np.testing.assert_allclose(float(sub), 0.5 * np.mean(resid[rows] ** 2), rtol=1e-5)
  g_whole = jax.grad(lambda a: loss(logprob=a, response_mask=mask,
                                    value_target=out.value_target))(lp)
  g_sub = jax.grad(lambda a: vm.vimpo_value_loss(
      logprob=a, logprob_ref=ref[rows], response_mask=mask[rows],
      value_target=out.value_target[rows], beta=0.1))(lp[rows])
  np.testing.assert_allclose(np.asarray(g_sub) * len(rows), np.asarray(g_whole)[rows] * B,
                             rtol=1e-4, atol=1e-7)
  spec = registry.get_estimator("vimpo").trained_loss
  assert spec.fn is vm.vimpo_value_loss and spec.targets == ("value_target",)


def test_bad_args_raise():
  kw = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
            response_mask=np.ones((B, T), bool), logprob=np.zeros((B, T), np.float32))
  with pytest.raises(AssertionError):
    vm.vimpo_advantages(logprob_ref=np.zeros((B, T + 1), np.float32), num_groups=N, **kw)
  with pytest.raises(ValueError, match="num_groups"):
    vm.vimpo_advantages(logprob_ref=np.zeros((B, T), np.float32), num_groups=0, **kw)
  with pytest.raises(ValueError, match="kl_estimate"):
    vm.vimpo_advantages(logprob_ref=np.zeros((B, T), np.float32), num_groups=N,
                        kl_estimate="k1", **kw)


def test_exact_kl_needs_the_field():
  spec = registry.get_estimator("vimpo")
  assert spec.needs_for({"exact_kl": True}) == spec.needs | {"kl_ref"}
  with pytest.raises(ValueError, match="exact_kl=True needs `kl_ref`"):
    vm.vimpo_advantages(exact_kl=True, **EX)


def test_block_sums_equal_the_scan():
  # λ = 1 (a Python float) sums by block products; a traced λ = 1 runs the recurrence scan.
  rng = np.random.default_rng(0)
  t = 70
  mask = (np.arange(t)[None] < rng.integers(0, t + 1, B)[:, None]) & (rng.random((B, t)) > 0.2)
  kw = dict(reward=rng.choice([0.0, 1.0], B).astype(np.float32),
            group_id=(np.arange(B) // G).astype(np.int32), response_mask=mask,
            logprob=rng.uniform(-4, 0, (B, t)).astype(np.float32),
            logprob_ref=rng.uniform(-4, 0, (B, t)).astype(np.float32), num_groups=N, beta=0.1)
  fast = vm.vimpo_advantages(**kw)
  scan = jax.jit(lambda lam: vm.vimpo_advantages(**kw, gae_lambda=lam))(jnp.float32(1.0))
  np.testing.assert_allclose(np.asarray(fast.advantages), np.asarray(scan.advantages),
                             rtol=1e-5, atol=1e-5)
