"""SALT (credit/advantages/tree/salt.py).

Registry-wide properties (jit, masking, padding, permutations, degenerate batches) live in
tests/registry_common_test.py.
"""
from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np

from credit import registry
from credit.advantages.tree import salt
from tests.advantages.tree.cbpo_test import grpo_np

FIELDS = ("reward", "group_id", "response_mask", "step_key", "step_mask", "step_id")
NG, G, K, T = 2, 4, 4, 10
B = NG * G
SETTINGS = dict(max_examples=10, deadline=None)


def make_batch(seed):
  """Steps of 1–3 tokens with a masked observation token after each; keys from a small
  alphabet so that steps repeat within and across rows."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), bool)
  sid = np.full((B, T), -1, np.int32)
  step_mask = np.zeros((B, K), bool)
  for b in range(B):
    t = 1
    for k in range(K):
      n = int(rng.integers(1, 3))
      if t + n > T or rng.random() < 0.15:
        break
      mask[b, t:t + n] = True
      sid[b, t:t + n] = k
      step_mask[b, k] = True
      t += n + 1
  return {"reward": rng.choice([0.0, 1.0, 0.5], B).astype(np.float32),
          "group_id": rng.permutation(np.repeat(np.arange(NG, dtype=np.int32), G)),
          "response_mask": mask, "step_key": rng.integers(0, 5, (B, K)).astype(np.int32),
          "step_mask": step_mask, "step_id": sid}


def ref_salt(b, eps=1e-6):
  r, g, mask = b["reward"].astype(np.float64), b["group_id"], b["response_mask"]
  key, smask, sid = b["step_key"], b["step_mask"], b["step_id"]
  valid = mask.any(1)
  nb = len(r)
  adv = grpo_np(r, g, valid, eps)
  step = np.zeros(key.shape)
  for i in range(nb):
    for s in range(key.shape[1]):
      if not (valid[i] and smask[i, s]):
        continue
      through = [j for j in range(nb) if valid[j] and g[j] == g[i]
                 and any(smask[j, u] and key[j, u] == key[i, s] for u in range(key.shape[1]))]
      step[i, s] = np.mean(adv[through])
  out = np.zeros(mask.shape)
  for i in range(nb):
    for t in np.flatnonzero(mask[i]):
      if 0 <= sid[i, t] < key.shape[1]:
        out[i, t] = step[i, sid[i, t]]
  return out


RUN = jax.jit(functools.partial(salt.salt_advantages, num_groups=NG))


def run(b):
  return np.asarray(RUN(**{k: b[k] for k in FIELDS}), np.float64)


def test_registered():
  spec = registry.get_estimator("salt")
  assert spec.family == "tree" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)



def test_spec_example():
  sid = np.array([[0, 1, 2]] * 3, np.int32)
  a = salt.salt_advantages(
      reward=np.array([1., 0, 0]), group_id=np.zeros(3, np.int32), response_mask=sid >= 0,
      step_key=np.array([[10, 20, 30], [10, 21, 31], [10, 20, 32]]),
      step_mask=np.ones((3, 3), bool), step_id=sid, num_groups=1)
  np.testing.assert_allclose(np.asarray(a), [[0, 0.288675, 1.154699],
                                             [0, -0.577349, -0.577349],
                                             [0, 0.288675, -0.577349]], atol=1e-5)


def test_repeated_step_counts_once():
  # Row 0 repeats key 7 twice; row 1 takes it once: the node's mean is (A_0 + A_1)/2.
  sid = np.array([[0, 1, 2]] * 2, np.int32)
  a = np.asarray(salt.salt_advantages(
      reward=np.array([1., 0]), group_id=np.zeros(2, np.int32), response_mask=sid >= 0,
      step_key=np.array([[7, 7, 1], [7, 2, 3]]), step_mask=np.ones((2, 3), bool), step_id=sid,
      num_groups=1))
  np.testing.assert_allclose(a[:, 0], 0.0, atol=1e-6)
  np.testing.assert_allclose(a[0, 1], 0.0, atol=1e-6)
  np.testing.assert_allclose(a[0, 2], np.sqrt(0.5), atol=1e-5)     # A = ±0.5/σ


def test_groups_do_not_merge_and_invalid_steps_do_not_count():
  sid = np.array([[0, 1]] * 4, np.int32)
  b = dict(reward=np.array([1., 0, 1, 0]), group_id=np.array([0, 0, 1, 1], np.int32),
           response_mask=sid >= 0, step_key=np.array([[5, 1], [5, 2], [1, 9], [2, 9]]),
           step_mask=np.array([[1, 1], [1, 1], [1, 1], [1, 0]], bool), step_id=sid)
  a = np.asarray(salt.salt_advantages(**b, num_groups=2))
  np.testing.assert_allclose(a, ref_salt(dict(b, reward=b["reward"].astype(np.float32))),
                             atol=1e-6)
  a0 = np.sqrt(0.5)
  np.testing.assert_allclose(a[0], [0, a0], atol=1e-5)      # key 1 of group 1 does not merge
  np.testing.assert_allclose(a[2, 1], a0, atol=1e-5)        # row 3's key 9 is not a step
  assert a[3, 1] == 0


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_matches_numpy_reference(seed):
  b = make_batch(seed)
  np.testing.assert_allclose(run(b), ref_salt(b), rtol=1e-5, atol=1e-5)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_key_relabelling_and_permutation_invariance(seed):
  b = make_batch(seed)
  want = run(b)
  relabel = dict(b, step_key=(b["step_key"] * 7919 + 13).astype(np.int32))
  np.testing.assert_allclose(run(relabel), want, rtol=1e-6, atol=1e-6)
  perm = np.random.default_rng(seed).permutation(B)
  np.testing.assert_allclose(run({k: v[perm] for k, v in b.items()}), want[perm], rtol=1e-5,
                             atol=1e-6)
  # All steps distinct: SALT is GRPO per token; all shared: zero.
  distinct = dict(b, step_key=np.arange(B * K, dtype=np.int32).reshape(B, K))
  grpo = grpo_np(b["reward"].astype(np.float64), b["group_id"], b["response_mask"].any(1))
  on_step = b["response_mask"] & (b["step_id"] >= 0)
  np.testing.assert_allclose(run(distinct), np.where(on_step, grpo[:, None], 0.0), rtol=1e-5,
                             atol=1e-6)
  shared = dict(b, step_key=np.zeros((B, K), np.int32))
  np.testing.assert_allclose(run(shared), 0.0, atol=1e-6)


def test_jit_equals_eager_and_degenerate():
  b = make_batch(3)
  np.testing.assert_allclose(np.asarray(salt.salt_advantages(**b, num_groups=NG)), run(b),
                             rtol=1e-6, atol=1e-6)
  same = run(dict(b, reward=np.ones(B, np.float32)))
  assert np.all(same == 0)
  empty = run(dict(b, step_mask=np.zeros((B, K), bool)))
  assert np.all(empty == 0)
