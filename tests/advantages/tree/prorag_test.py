"""ProRAG (credit/advantages/tree/prorag.py).

Registry-wide properties (jit, masking, padding, permutations, degenerate batches) also run in
tests/registry_common_test.py.
"""
from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.tree import prorag
from credit.contract import ContractError

N, G, T, K = 2, 4, 6, 3
B = N * G
FIELDS = ("reward", "step_reward", "step_mask", "step_id", "group_id", "response_mask")


@functools.lru_cache(maxsize=None)
def jitted(group_size=None, **kw):
  return jax.jit(functools.partial(prorag.prorag_advantages, num_groups=N,
                                   group_size=group_size, **kw))


def make_batch(seed: int, contiguous: bool = True) -> dict:
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, T + 1, B)
  mask = np.arange(T)[None, :] < lengths[:, None]
  sid = np.where(mask, np.minimum(np.arange(T) // 2, K - 1), -1).astype(np.int32)
  sid[rng.random((B, T)) < 0.15] = -1                      # tokens outside any step
  step_mask = rng.random((B, K)) < 0.8
  gid = np.arange(B, dtype=np.int32) // G
  if not contiguous:
    gid = gid[rng.permutation(B)]
  return dict(reward=rng.choice([0.0, 1.0, 0.5], B).astype(np.float32),
              step_reward=rng.uniform(0, 1, (B, K)).astype(np.float32),
              step_mask=step_mask, step_id=sid, group_id=gid, response_mask=mask)


def ref_prorag(b, beta=0.3, eps=1e-4, var_eps=1e-8):
  """Plain loops over groups, as ProRAG's trainer (its masking and size-1 groups)."""
  r = b["reward"].astype(np.float64)
  m, sid, sm = b["response_mask"], b["step_id"], b["step_mask"]
  s = b["step_reward"].astype(np.float64)
  out = np.zeros(m.shape)
  valid = m.any(1)
  for g in np.unique(b["group_id"]):
    rows = [i for i in range(B) if b["group_id"][i] == g and valid[i]]
    if len(rows) < 2:
      continue
    rg = r[rows]
    a_o = (rg - rg.mean()) / (rg.std(ddof=1) + eps)
    toks = [(i, t) for i in rows for t in range(T)
            if m[i, t] and 0 <= sid[i, t] < K and sm[i, sid[i, t]]]
    vals = np.array([s[i, sid[i, t]] for i, t in toks])
    mu = vals.mean() if len(vals) else 0.0
    sd = np.sqrt(((vals - mu) ** 2).mean() + var_eps) if len(vals) > 1 else 1.0
    for j, i in enumerate(rows):
      for t in range(T):
        if not m[i, t]:
          continue
        step = (i, t) in toks
        out[i, t] = a_o[j] + (beta * (s[i, sid[i, t]] - mu) / sd if step else 0.0)
  return out


def test_registered():
  spec = registry.get_estimator("prorag")
  assert spec.family == "tree" and spec.confidence == "code-verified"
  assert spec.needs == set(FIELDS)



def test_spec_example():
  a = prorag.prorag_advantages(
      reward=np.array([1.0, 0.0]), step_reward=np.array([[0.9, 0.2], [0.5, 0.0]]),
      step_mask=np.array([[1, 1], [1, 0]], bool),
      step_id=np.array([[0, 0, 1], [0, 0, -1]], np.int32), group_id=np.zeros(2, np.int32),
      response_mask=np.array([[1, 1, 1], [1, 1, 0]], bool), num_groups=1)
  np.testing.assert_allclose(np.asarray(a), [[1.042417, 1.042417, 0.259793],
                                             [-0.818810, -0.818810, 0.0]], atol=1e-5)


@hypothesis.settings(max_examples=10)
@hypothesis.given(seed=st.integers(0, 10_000), contiguous=st.booleans())
def test_matches_numpy_reference(seed, contiguous):
  b = make_batch(seed, contiguous)
  got = np.asarray(jitted()(**b))
  np.testing.assert_allclose(got, ref_prorag(b), rtol=1e-4, atol=1e-5)


def test_fast_path_and_eager_equal_jit():
  b = make_batch(4)
  want = np.asarray(jitted()(**b))
  np.testing.assert_allclose(np.asarray(jitted(G)(**b)), want, rtol=1e-6, atol=1e-6)
  eager = prorag.prorag_advantages(**b, num_groups=N)
  np.testing.assert_allclose(np.asarray(eager), want, rtol=1e-6, atol=1e-6)


@hypothesis.settings(max_examples=8)
@hypothesis.given(seed=st.integers(0, 10_000), drop=st.integers(0, B - 1))
def test_masked_row_equals_sliced_row(seed, drop):
  b = make_batch(seed, contiguous=False)
  keep = np.arange(B) != drop
  masked = np.asarray(jitted()(**dict(b, response_mask=b["response_mask"] & keep[:, None])))
  sliced = jitted()(**{k: v[keep] for k, v in b.items()})
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[keep], np.asarray(sliced), rtol=1e-5, atol=1e-6)


@hypothesis.settings(max_examples=8)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_padding_and_permutation_invariance(seed):
  b = make_batch(seed, contiguous=False)
  want = np.asarray(jitted()(**b))
  pad = dict(b, response_mask=np.pad(b["response_mask"], ((0, 0), (0, 3))),
             step_id=np.pad(b["step_id"], ((0, 0), (0, 3)), constant_values=2),
             step_reward=np.where(b["step_mask"], b["step_reward"], np.nan))
  got = np.asarray(jitted()(**pad))
  assert np.all(got[:, T:] == 0)
  np.testing.assert_allclose(got[:, :T], want, rtol=1e-5, atol=1e-6)
  perm = np.random.default_rng(seed).permutation(B)
  pout = np.asarray(jitted()(**{k: v[perm] for k, v in b.items()}))
  np.testing.assert_allclose(pout, want[perm], rtol=1e-5, atol=1e-6)


def test_beta_zero_is_grpo_with_code_eps():
  b = make_batch(3)
  a = np.asarray(jitted(beta=0.0)(**b))
  want = grpo_advantages(reward=b["reward"], group_id=b["group_id"],
                         response_mask=b["response_mask"], num_groups=N, eps=1e-4)
  np.testing.assert_allclose(a, np.asarray(want), rtol=1e-6, atol=1e-7)


def test_degenerate_groups():
  b = make_batch(1)
  # A group with one valid row: all zeros (the code's NaN), even where the step term differs.
  m = b["response_mask"].copy()
  m[1:G] = False
  m[0] = True
  a = np.asarray(jitted()(**dict(b, response_mask=m)))
  assert np.all(a[:G] == 0) and np.all(np.isfinite(a))
  # Equal rewards and equal step scores: exact zeros; one scored token in a group (σ' = 1): finite.
  same = dict(b, reward=np.full(B, 0.5, np.float32), step_reward=np.full((B, K), 0.3, np.float32))
  assert np.all(np.asarray(jitted()(**same)) == 0)
  one = np.zeros((B, T), bool)
  one[0, 0] = one[1, 0] = True
  sid = np.where(one, 0, -1).astype(np.int32)
  sid[1, 0] = -1
  a = np.asarray(jitted()(**dict(b, response_mask=one, step_id=sid,
                                  step_mask=np.ones((B, K), bool))))
  assert np.all(np.isfinite(a)) and a[0, 0] != 0 and np.all(a[G:] == 0)
  # Gradient with respect to the float inputs is finite.
  g = jax.grad(lambda r, s: jitted()(**dict(b, reward=r, step_reward=s)).sum(), (0, 1))(
      b["reward"], b["step_reward"])
  assert all(np.all(np.isfinite(np.asarray(x))) for x in g)


def test_validation():
  b = make_batch(0)
  prorag.validate_prorag_inputs(**b, num_groups=N)
  with pytest.raises(ContractError, match="reward"):
    prorag.validate_prorag_inputs(**dict(b, reward=np.full(B, np.nan, np.float32)),
                                  num_groups=N)
  with pytest.raises(ContractError, match="selects no token"):
    prorag.validate_prorag_inputs(**dict(b, response_mask=np.zeros((B, T), bool)),
                                  num_groups=N)
  with pytest.raises(ContractError, match="step_id"):
    prorag.validate_prorag_inputs(**dict(b, step_id=np.where(b["response_mask"], K, -1)),
                                  num_groups=N)
  with pytest.raises(ContractError, match="shape"):
    prorag.validate_prorag_inputs(**dict(b, step_reward=np.zeros((B, K + 1), np.float32)),
                                  num_groups=N)
