"""PROPA (credit/advantages/tree/propa.py); spec distill_and_structure.md B9.

Registry-wide properties (jit, masking, padding, permutations, degenerate batches) also run in
tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.tree import propa
from credit.contract import ContractError
from tests.advantages.tree.prorag_test import B, G, K, N, T, make_batch

FIELDS = ("reward", "step_value", "step_mask", "step_id", "group_id", "response_mask")


@functools.lru_cache(maxsize=None)
def jitted(group_size=None, **kw):
  return jax.jit(functools.partial(propa.propa_advantages, num_groups=N,
                                   group_size=group_size, **kw))


def batch(seed, contiguous=True):
  b = make_batch(seed, contiguous)
  b["step_value"] = b.pop("step_reward")
  return b


def ref_propa(b, beta=0.3, eps=1e-4, var_eps=1e-8, boost=False):
  r = b["reward"].astype(np.float64)
  m, sid, sm = b["response_mask"], b["step_id"], b["step_mask"]
  q = b["step_value"].astype(np.float64)
  if boost:
    q = np.log1p(10 * np.clip(q, 0, 1)) / np.log(11)
  out = np.zeros(m.shape)
  valid = m.any(1)
  for g in np.unique(b["group_id"]):
    rows = [i for i in range(B) if b["group_id"][i] == g and valid[i]]
    if len(rows) < 2:
      continue
    rg = r[rows]
    a_o = (rg - rg.mean()) / (rg.std(ddof=1) + eps)
    cells = np.array([q[i, k] for i in rows for k in range(K) if sm[i, k]])
    mu = cells.mean() if len(cells) else 0.0
    sd = np.sqrt(((cells - mu) ** 2).mean() + var_eps) if len(cells) > 1 else 1.0
    for j, i in enumerate(rows):
      for t in range(T):
        if m[i, t]:
          k = sid[i, t]
          step = 0 <= k < K and sm[i, k]
          out[i, t] = a_o[j] + (beta * (q[i, k] - mu) / sd if step else 0.0)
  return out


def test_registered():
  spec = registry.get_estimator("propa")
  assert spec.family == "tree" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(propa, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example_step_weighted():
  # B8's numbers with Q in place of the PRM score; stats over the 3 valid steps
  # (0.9, 0.2, 0.5): μ = 0.533333, σ = sqrt(0.082222 + 1e-8) = 0.286744.
  a = propa.propa_advantages(
      reward=np.array([1.0, 0.0]), step_value=np.array([[0.9, 0.2], [0.5, 0.0]]),
      step_mask=np.array([[1, 1], [1, 0]], bool),
      step_id=np.array([[0, 0, 1], [0, 0, -1]], np.int32), group_id=np.zeros(2, np.int32),
      response_mask=np.array([[1, 1, 1], [1, 1, 0]], bool), num_groups=1)
  a_o = 0.707007
  z = (np.array([0.9, 0.2, 0.5]) - 0.533333) / 0.286744
  want = [[a_o + 0.3 * z[0]] * 2 + [a_o + 0.3 * z[1]], [-a_o + 0.3 * z[2]] * 2 + [0.0]]
  np.testing.assert_allclose(np.asarray(a), want, atol=1e-5)


@hypothesis.settings(max_examples=10)
@hypothesis.given(seed=st.integers(0, 10_000), contiguous=st.booleans())
def test_matches_numpy_reference(seed, contiguous):
  b = batch(seed, contiguous)
  np.testing.assert_allclose(np.asarray(jitted()(**b)), ref_propa(b), rtol=1e-4, atol=1e-5)


def test_log_boost_transform_and_fast_path():
  b = batch(5)
  got = np.asarray(jitted(value_transform="log_boost")(**b))
  np.testing.assert_allclose(got, ref_propa(b, boost=True), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jitted(G)(**b)), np.asarray(jitted()(**b)),
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(propa.log_boost(np.array([-1.0, 0.0, 0.5, 1.0, 2.0]))),
                             [0, 0, np.log(6) / np.log(11), 1, 1], rtol=1e-6)
  with pytest.raises(ValueError, match="value_transform"):
    propa.propa_advantages(**b, num_groups=N, value_transform="exp")


@hypothesis.settings(max_examples=6)
@hypothesis.given(seed=st.integers(0, 10_000), drop=st.integers(0, B - 1))
def test_masked_row_equals_sliced_row_and_permutation(seed, drop):
  b = batch(seed, contiguous=False)
  keep = np.arange(B) != drop
  masked = np.asarray(jitted()(**dict(b, response_mask=b["response_mask"] & keep[:, None])))
  sliced = jitted()(**{k: v[keep] for k, v in b.items()})
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[keep], np.asarray(sliced), rtol=1e-5, atol=1e-6)
  perm = np.random.default_rng(seed).permutation(B)
  want = np.asarray(jitted()(**b))
  np.testing.assert_allclose(np.asarray(jitted()(**{k: v[perm] for k, v in b.items()})),
                             want[perm], rtol=1e-5, atol=1e-6)


def test_step_weighting_differs_from_token_weighting():
  # One long step and one short step: ProRAG weighs by tokens, PROPA counts each step once.
  from credit.advantages.tree import prorag
  kw = dict(reward=np.array([1.0, 0.0]), step_mask=np.ones((2, 1), bool),
            step_id=np.array([[0, 0, 0, 0], [0, -1, -1, -1]], np.int32),
            group_id=np.zeros(2, np.int32),
            response_mask=np.array([[1, 1, 1, 1], [1, 0, 0, 0]], bool), num_groups=1,
            beta=1.0)
  v = np.array([[1.0], [0.0]])
  a_step = np.asarray(propa.propa_advantages(step_value=v, **kw))
  a_tok = np.asarray(prorag.prorag_advantages(step_reward=v, **kw))
  a_o = 1 / (np.sqrt(0.5) + 1e-4) / 2
  np.testing.assert_allclose(a_step[:, 0], [a_o + 1.0, -a_o - 1.0], atol=1e-4)  # μ=.5, σ=.5
  np.testing.assert_allclose(a_tok[:, 0], [a_o + 0.5, -a_o - 2.0], atol=1e-4)   # μ=.8, σ=.4


def test_degenerate_and_validation():
  b = batch(2)
  same = dict(b, reward=np.full(B, 1.0, np.float32), step_value=np.full((B, K), 0.4, np.float32))
  assert np.all(np.asarray(jitted()(**same)) == 0)
  nan_q = dict(b, step_value=np.where(b["step_mask"], b["step_value"], np.nan))
  np.testing.assert_allclose(np.asarray(jitted()(**nan_q)), np.asarray(jitted()(**b)))
  g = jax.grad(lambda q: jitted()(**dict(b, step_value=q)).sum())(b["step_value"])
  assert np.all(np.isfinite(np.asarray(g)))
  propa.validate_propa_inputs(**b, num_groups=N)
  with pytest.raises(ContractError, match="step_value"):
    propa.validate_propa_inputs(**dict(b, step_value=np.full((B, K), np.nan, np.float32),
                                       step_mask=np.ones((B, K), bool)), num_groups=N)
  with pytest.raises(ContractError, match="group_id"):
    propa.validate_propa_inputs(**b, num_groups=1)
