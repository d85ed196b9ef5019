"""CoSearch (credit/advantages/tree/cosearch.py).

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
from credit.advantages.tree import cosearch
from credit.contract import ContractError

N, G, T = 2, 5, 5
B = N * G
H = 4096
FIELDS = ("tokens", "query_mask", "reward", "group_id", "response_mask")


@functools.lru_cache(maxsize=None)
def jitted(**kw):
  return jax.jit(functools.partial(cosearch.cosearch_advantages, num_groups=N, **kw))


def make_batch(seed, contiguous=True):
  rng = np.random.default_rng(seed)
  mask = np.arange(T)[None, :] < rng.integers(0, T + 1, B)[:, None]
  gid = np.arange(B, dtype=np.int32) // G
  if not contiguous:
    gid = gid[rng.permutation(B)]
  return dict(tokens=rng.integers(0, 8, (B, T)).astype(np.int32),      # small vocab: overlaps
              query_mask=mask & (rng.random((B, T)) < 0.8),
              reward=rng.choice([0.0, 1.0, 0.5], B).astype(np.float32), group_id=gid,
              response_mask=mask,
              reward_components=rng.uniform(0, 1, (B, 2)).astype(np.float32))


def np_bucket(tok, num_buckets=H):
  x = (tok.astype(np.uint64) * 0x9E3779B1) & 0xFFFFFFFF
  x = x ^ (x >> 16)
  return (x % num_buckets).astype(np.int64)


def ref_groups(b, tau=0.5, num_buckets=H):
  m, q = b["response_mask"], b["query_mask"] & b["response_mask"]
  valid = m.any(1)
  sets = [set(np_bucket(b["tokens"][i][q[i]], num_buckets).tolist()) if valid[i] else set()
          for i in range(B)]
  parent = list(range(B))

  def find(i):
    while parent[i] != i:
      i = parent[i]
    return i

  for i in range(B):
    for j in range(B):
      if sets[i] and sets[j] and b["group_id"][i] == b["group_id"][j]:
        if len(sets[i] & sets[j]) / len(sets[i] | sets[j]) >= tau:
          parent[find(i)] = find(j)
  return np.array([find(i) for i in range(B)]), valid


def ref_cosearch(b, tau=0.5, alpha=0.0, eps=1e-6, num_buckets=H):
  comp, valid = ref_groups(b, tau, num_buckets)
  r = (1 - alpha) * b["reward"].astype(np.float64) + alpha * b["reward_components"][:, 0]
  a = np.zeros(B)
  for c in np.unique(comp):
    rows = np.flatnonzero((comp == c) & valid)
    if len(rows) >= 2:
      a[rows] = (r[rows] - r[rows].mean()) / (r[rows].std(ddof=1) + eps)
  sizes = np.array([np.sum((comp == comp[i]) & valid) for i in range(B)])
  frac = np.sum(valid & (sizes == 1)) / max(valid.sum(), 1)
  return np.where(b["response_mask"], a[:, None], 0.0), frac


def data(b):
  return {k: b[k] for k in FIELDS}


def test_registered():
  spec = registry.get_estimator("cosearch")
  assert spec.family == "tree" and spec.confidence == "inferred" and spec.returns_output
  assert spec.needs == set(FIELDS)
  assert spec.needs_for({"rank_weight": 0.5}) == set(FIELDS) | {"reward_components"}



def test_spec_example():
  # S1={5,6,7}, S2={5,6,8}, S3={9,10}: J12 = 0.5 -> groups {1,2},{3}; rewards [0.8,0.4,x].
  tok = np.array([[5, 6, 7], [5, 6, 8], [9, 10, 10]], np.int32)
  qm = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0]], bool)
  out = cosearch.cosearch_advantages(tokens=tok, query_mask=qm, reward=np.array([0.8, 0.4, 0.9]),
                                     group_id=np.zeros(3, np.int32),
                                     response_mask=np.ones((3, 3), bool), num_groups=1)
  np.testing.assert_allclose(np.asarray(out.advantages[:, 0]), [0.707106, -0.707106, 0.0],
                             atol=1e-5)
  np.testing.assert_allclose(float(out.metrics["singleton_fraction"]), 1 / 3, rtol=1e-6)
  assert float(out.metrics["num_semantic_groups"]) == 2
  g = cosearch.cosearch_groups(tokens=tok, query_mask=qm, group_id=np.zeros(3, np.int32),
                               valid=np.ones(3, bool))
  assert np.asarray(g.group_id).tolist() == [0, 0, 2]
  # τ just above 0.5 splits {1,2}; the same rows in two prompt groups never merge.
  out = cosearch.cosearch_advantages(tokens=tok, query_mask=qm, reward=np.array([0.8, 0.4, 0.9]),
                                     group_id=np.zeros(3, np.int32),
                                     response_mask=np.ones((3, 3), bool), num_groups=1, tau=0.51)
  assert np.all(np.asarray(out.advantages) == 0)
  out = cosearch.cosearch_advantages(tokens=tok, query_mask=qm, reward=np.array([0.8, 0.4, 0.9]),
                                     group_id=np.array([0, 1, 0], np.int32),
                                     response_mask=np.ones((3, 3), bool), num_groups=2)
  assert np.all(np.asarray(out.advantages) == 0)


def test_chains_are_one_component():
  # 1~2 and 2~3 but not 1~3: label propagation joins all three.
  tok = np.array([[1, 2, 3, 4], [3, 4, 5, 6], [5, 6, 7, 8]], np.int32)
  g = cosearch.cosearch_groups(tokens=tok, query_mask=np.ones((3, 4), bool),
                               group_id=np.zeros(3, np.int32), valid=np.ones(3, bool), tau=0.3)
  assert np.asarray(g.group_id).tolist() == [0, 0, 0]
  np.testing.assert_array_equal(np.asarray(g.size), [3, 3, 3])


@hypothesis.settings(max_examples=12)
@hypothesis.given(seed=st.integers(0, 10_000), contiguous=st.booleans())
def test_matches_numpy_reference(seed, contiguous):
  b = make_batch(seed, contiguous)
  out = jitted()(**data(b))
  want, frac = ref_cosearch(b)
  np.testing.assert_allclose(np.asarray(out.advantages), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(out.metrics["singleton_fraction"]), frac, rtol=1e-6)


def test_blend_small_buckets_and_eager():
  b = make_batch(11)
  out = jitted(rank_weight=0.5)(**data(b), reward_components=b["reward_components"])
  np.testing.assert_allclose(np.asarray(out.advantages), ref_cosearch(b, alpha=0.5)[0],
                             rtol=1e-5, atol=1e-6)
  out = jitted(num_buckets=7)(**data(b))                  # heavy collisions: still exact vs ref
  np.testing.assert_allclose(np.asarray(out.advantages), ref_cosearch(b, num_buckets=7)[0],
                             rtol=1e-5, atol=1e-6)
  eager = cosearch.cosearch_advantages(**data(b), num_groups=N)
  np.testing.assert_allclose(np.asarray(eager.advantages), np.asarray(jitted()(**data(b))[0]),
                             rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="reward_components"):
    cosearch.cosearch_advantages(**data(b), num_groups=N, rank_weight=0.5)
  with pytest.raises(ValueError, match="rank_column"):
    cosearch.cosearch_advantages(**data(b), num_groups=N, rank_weight=0.5, rank_column=2,
                                 reward_components=b["reward_components"])


@hypothesis.settings(max_examples=6)
@hypothesis.given(seed=st.integers(0, 10_000), drop=st.integers(0, B - 1))
def test_masking_padding_permutation(seed, drop):
  b = make_batch(seed, contiguous=False)
  want = np.asarray(jitted()(**data(b)).advantages)
  keep = np.arange(B) != drop
  masked = jitted()(**dict(data(b), response_mask=b["response_mask"] & keep[:, None]))
  sliced = jitted()(**{k: v[keep] for k, v in data(b).items()})
  assert np.all(np.asarray(masked.advantages)[drop] == 0)
  np.testing.assert_allclose(np.asarray(masked.advantages)[keep], np.asarray(sliced.advantages),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(masked.metrics["singleton_fraction"]),
                             float(sliced.metrics["singleton_fraction"]), rtol=1e-6)
  pad = dict(data(b), response_mask=np.pad(b["response_mask"], ((0, 0), (0, 2))),
             query_mask=np.pad(b["query_mask"], ((0, 0), (0, 2))),
             tokens=np.pad(b["tokens"], ((0, 0), (0, 2)), constant_values=-1))
  got = np.asarray(jitted()(**pad).advantages)
  np.testing.assert_allclose(got[:, :T], want, rtol=1e-5, atol=1e-6)
  assert np.all(got[:, T:] == 0)
  perm = np.random.default_rng(seed).permutation(B)
  pout = jitted()(**{k: v[perm] for k, v in data(b).items()})
  np.testing.assert_allclose(np.asarray(pout.advantages), want[perm], rtol=1e-5, atol=1e-6)


def test_degenerate_and_validation():
  b = make_batch(2)
  same = dict(data(b), reward=np.full(B, 1.0, np.float32))
  assert np.all(np.asarray(jitted()(**same).advantages) == 0)
  noq = dict(data(b), query_mask=np.zeros((B, T), bool))      # no queries: all singletons
  out = jitted()(**noq)
  assert np.all(np.asarray(out.advantages) == 0)
  assert float(out.metrics["singleton_fraction"]) == 1.0
  loose = dict(data(b), query_mask=np.ones((B, T), bool))    # query tokens off the mask: ignored
  np.testing.assert_array_equal(np.asarray(jitted()(**loose).advantages),
                                np.asarray(jitted()(**dict(loose, query_mask=b["response_mask"])
                                                    ).advantages))
  g = jax.grad(lambda r: jitted()(**dict(data(b), reward=r)).advantages.sum())(b["reward"])
  assert np.all(np.isfinite(np.asarray(g)))
  cosearch.validate_cosearch_inputs(**data(b), num_groups=N)
  with pytest.raises(ContractError, match="non-negative"):
    cosearch.validate_cosearch_inputs(**dict(data(b), tokens=-np.ones((B, T), np.int32),
                                             query_mask=b["response_mask"]), num_groups=N)
  with pytest.raises(ContractError, match="reward"):
    cosearch.validate_cosearch_inputs(**dict(data(b), reward=np.full(B, np.nan, np.float32)),
                                      num_groups=N)
