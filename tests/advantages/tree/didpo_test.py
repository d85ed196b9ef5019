"""DiDPO (credit/advantages/tree/didpo.py).

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
from credit.advantages.tree import didpo
from credit.contract import ContractError

N, G, T = 2, 4, 6
B = N * G
FIELDS = ("anchor_id", "reward", "group_id", "response_mask")


@functools.lru_cache(maxsize=None)
def jitted(group_size=None, **kw):
  return jax.jit(functools.partial(didpo.didpo_advantages, num_groups=N,
                                   group_size=group_size, **kw))


def make_batch(seed, contiguous=True, num_anchors=3):
  rng = np.random.default_rng(seed)
  mask = np.arange(T)[None, :] < rng.integers(0, T + 1, B)[:, None]
  anc = np.where(mask, rng.integers(-1, num_anchors, (B, T)), -1).astype(np.int32)
  anc[anc == 2] = 1_000_003                                   # ids need not be small
  gid = np.arange(B, dtype=np.int32) // G
  if not contiguous:
    gid = gid[rng.permutation(B)]
  return dict(anchor_id=anc, reward=rng.choice([0.0, 1.0, 0.5, 2.0], B).astype(np.float32),
              group_id=gid, response_mask=mask)


def ref_didpo(b, eps=1e-6, min_size=2):
  r = b["reward"].astype(np.float64)
  m, anc, gid = b["response_mask"], b["anchor_id"], b["group_id"]
  valid = m.any(1)
  grpo = np.zeros(B)
  for g in np.unique(gid):
    rows = np.flatnonzero((gid == g) & valid)
    if len(rows) >= 2:
      grpo[rows] = (r[rows] - r[rows].mean()) / (r[rows].std(ddof=1) + eps)
  out = np.zeros(m.shape)
  for i in range(B):
    for t in range(T):
      if not m[i, t]:
        continue
      out[i, t] = grpo[i]
      a = anc[i, t]
      if a < 0:
        continue
      members = [j for j in range(B) if valid[j] and gid[j] == gid[i]
                 and np.any(m[j] & (anc[j] == a))]                 # each row once
      if len(members) >= min_size:
        x = r[members]
        out[i, t] = (r[i] - x.mean()) / (x.std(ddof=1) + eps)
  return out


def test_registered():
  spec = registry.get_estimator("didpo")
  assert spec.family == "tree" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)



def test_spec_example():
  # Anchor {b0 r=1, b2 r=0} (b2 carries it on two tokens: one member) -> ±0.707106.
  a = didpo.didpo_advantages(anchor_id=np.array([[4, 4, -1], [-1, -1, -1], [4, 4, -1]],
                                                np.int32),
                             reward=np.array([1.0, 0.5, 0.0]), group_id=np.zeros(3, np.int32),
                             response_mask=np.ones((3, 3), bool), num_groups=1)
  a = np.asarray(a)
  np.testing.assert_allclose(a[[0, 0, 2, 2], [0, 1, 0, 1]], [0.707106, 0.707106, -0.707106,
                                                              -0.707106], atol=1e-5)
  np.testing.assert_allclose(a[:, 2], [1.0, 0.0, -1.0], atol=1e-5)   # GRPO fallback


@hypothesis.settings(max_examples=12)
@hypothesis.given(seed=st.integers(0, 10_000), contiguous=st.booleans())
def test_matches_numpy_reference(seed, contiguous):
  b = make_batch(seed, contiguous)
  np.testing.assert_allclose(np.asarray(jitted()(**b)), ref_didpo(b), rtol=1e-4, atol=1e-5)


def test_fast_path_eager_and_min_anchor_size():
  b = make_batch(7)
  want = np.asarray(jitted()(**b))
  np.testing.assert_allclose(np.asarray(jitted(G)(**b)), want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(didpo.didpo_advantages(**b, num_groups=N)), want,
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jitted(min_anchor_size=3)(**b)),
                             ref_didpo(b, min_size=3), rtol=1e-4, atol=1e-5)


def test_no_anchor_is_grpo_and_anchor_ids_are_local_to_groups():
  b = make_batch(3)
  none = dict(b, anchor_id=np.full((B, T), -1, np.int32))
  want = grpo_advantages(reward=b["reward"], group_id=b["group_id"],
                         response_mask=b["response_mask"], num_groups=N)
  np.testing.assert_allclose(np.asarray(jitted()(**none)), np.asarray(want), rtol=1e-6)
  # The same anchor id in two prompt groups is two anchors.
  one = dict(b, anchor_id=np.where(b["response_mask"], 7, -1).astype(np.int32))
  np.testing.assert_allclose(np.asarray(jitted()(**one)), np.asarray(want), rtol=1e-5,
                             atol=1e-6)


@hypothesis.settings(max_examples=6)
@hypothesis.given(seed=st.integers(0, 10_000), drop=st.integers(0, B - 1))
def test_masking_padding_permutation(seed, drop):
  b = make_batch(seed, contiguous=False)
  want = np.asarray(jitted()(**b))
  keep = np.arange(B) != drop
  masked = np.asarray(jitted()(**dict(b, response_mask=b["response_mask"] & keep[:, None])))
  sliced = jitted()(**{k: v[keep] for k, v in b.items()})
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[keep], np.asarray(sliced), rtol=1e-5, atol=1e-6)
  pad = dict(b, response_mask=np.pad(b["response_mask"], ((0, 0), (0, 2))),
             anchor_id=np.pad(b["anchor_id"], ((0, 0), (0, 2)), constant_values=0))
  got = np.asarray(jitted()(**pad))
  np.testing.assert_allclose(got[:, :T], want, rtol=1e-5, atol=1e-6)
  assert np.all(got[:, T:] == 0)
  perm = np.random.default_rng(seed).permutation(B)
  np.testing.assert_allclose(np.asarray(jitted()(**{k: v[perm] for k, v in b.items()})),
                             want[perm], rtol=1e-5, atol=1e-6)


def test_degenerate_and_validation():
  b = make_batch(1)
  same = dict(b, reward=np.full(B, 0.25, np.float32))
  assert np.all(np.asarray(jitted()(**same)) == 0)
  g = jax.grad(lambda r: jitted()(**dict(same, reward=r)).sum())(same["reward"])
  assert np.all(np.isfinite(np.asarray(g)))
  didpo.validate_didpo_inputs(**b, num_groups=N)
  with pytest.raises(ContractError, match="anchor_id"):
    didpo.validate_didpo_inputs(**dict(b, anchor_id=np.where(b["response_mask"], -2, -1)),
                                num_groups=N)
  with pytest.raises(ContractError, match="reward"):
    didpo.validate_didpo_inputs(**dict(b, reward=np.full(B, np.inf, np.float32)), num_groups=N)
  with pytest.raises(ValueError, match="min_anchor_size"):
    didpo.didpo_advantages(**b, num_groups=N, min_anchor_size=0)
