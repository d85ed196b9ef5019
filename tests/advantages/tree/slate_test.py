"""SLATE (credit/advantages/tree/slate.py)."""
from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from credit import registry, trees
from credit.advantages.tree import slate
from tests.advantages.tree.cbpo_test import (B, NG, SETTINGS, T, grpo_np, leaf_rows, make_tree,
                                             pad_columns, slice_rows)

FIELDS = ("reward", "group_id", "response_mask", "parent_id", "prefix_len")


def ref_slate(b, eps=1e-6):
  r = b["reward"].astype(np.float64)
  mask, par, pre, g = b["response_mask"], b["parent_id"], b["prefix_len"], b["group_id"]
  valid = mask.any(1)
  key = [(int(par[i]), int(pre[i])) if par[i] >= 0 else (-1, int(g[i])) for i in range(len(r))]
  ids = {k: i for i, k in enumerate(dict.fromkeys(key))}
  node = np.array([ids[k] for k in key])
  adv = grpo_np(r, node, valid, eps)
  return np.where(mask & valid[:, None], adv[:, None], 0.0)


@functools.lru_cache(maxsize=None)
def jitted():
  return jax.jit(functools.partial(slate.slate_advantages, num_groups=NG))


def run(b):
  return np.asarray(jitted()(**{k: b[k] for k in FIELDS}), np.float64)


def test_registered():
  spec = registry.get_estimator("slate")
  assert spec.family == "tree" and spec.confidence == "code-verified"



ONE = jax.jit(functools.partial(slate.slate_advantages, num_groups=1))


def test_spec_example():
  # r = [2,1,0,−1,2] → A = [0.920357, 0.153393, −0.613572, −1.380536, 0.920357], as the
  # k = 5 candidates of one node (second step: all continue row 0 from column 3).
  mask = np.zeros((6, 5), bool)
  mask[0, 1:3] = True
  mask[1:, 3:] = True
  b = {"reward": np.array([0.5, 2, 1, 0, -1, 2], np.float32), "group_id": np.zeros(6, np.int32),
       "response_mask": mask, "parent_id": np.array([-1, 0, 0, 0, 0, 0], np.int32),
       "prefix_len": np.array([0, 3, 3, 3, 3, 3], np.int32)}
  a = np.asarray(ONE(**b))
  np.testing.assert_allclose(a[1:, 3], [0.920357, 0.153393, -0.613572, -1.380536, 0.920357],
                             atol=1e-5)
  assert np.all(a[0] == 0)                   # the parent is no member; a lone root → 0
  np.testing.assert_allclose(float(slate.slate_answer_bonus(1)), 0.075, atol=1e-7)
  # The host-side normaliser of the sampler agrees.
  np.testing.assert_allclose(trees.node_normalize(np.array([[2., 1, 0, -1, 2]]))[0],
                             a[1:, 3], atol=1e-5)


def test_step_reward_helper():
  think = np.array([1., 0, -1, 1])
  qa = np.array([1., 1, 0, -1])
  is_answer = np.array([False, True, True, True])
  step = np.array([0, 1, 3, 4])
  got = np.asarray(slate.slate_step_reward(think, qa, is_answer, step))
  np.testing.assert_allclose(got, [2.0, 1.075, -1 + 0.025, 0.0], atol=1e-6)
  got = slate.slate_step_reward(think, qa, is_answer, step, max_steps=2, coef=1.0)
  np.testing.assert_allclose(np.asarray(got), [2.0, 1.5, -1 - 0.5, -1.0], atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_matches_numpy_reference(seed):
  b = make_tree(seed, k=3, rewards=(-1.0, 0.0, 1.0, 2.075))
  np.testing.assert_allclose(run(b), ref_slate(b), rtol=1e-5, atol=1e-5)


def test_step_rollout_layout():
  # Steps of 3 candidates: each step's candidates continue the chosen one of the step before.
  mask = np.zeros((9, 10), bool)
  mask[0:3, 1:3] = True
  mask[3:6, 3:6] = True
  mask[6:9, 6:8] = True
  b = {"reward": np.array([1., 0, -1, 2, 2, 2, 1, 0, 0], np.float32),
       "group_id": np.zeros(9, np.int32), "response_mask": mask,
       "parent_id": np.array([-1, -1, -1, 0, 0, 0, 3, 3, 3], np.int32),
       "prefix_len": np.array([0, 0, 0, 3, 3, 3, 6, 6, 6], np.int32)}
  a = np.asarray(ONE(**b), np.float64)
  np.testing.assert_allclose(a[:3, 1], [1, 0, -1], atol=1e-5)
  assert np.all(a[3:6] == 0)                          # all-equal candidates
  np.testing.assert_allclose(a[6:, 6], [2 / np.sqrt(3), -1 / np.sqrt(3), -1 / np.sqrt(3)],
                             atol=1e-5)
  np.testing.assert_allclose(a, ref_slate(b), atol=1e-6)


def test_singleton_node_is_zero_not_nan():
  b = make_tree(2, k=1)
  out = run(b)
  children = b["parent_id"] >= 0
  assert np.all(out[children] == 0) and np.all(np.isfinite(out))


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_masking_padding_permutation(seed):
  b = make_tree(seed)
  want = run(b)
  rng = np.random.default_rng(seed)
  drop = np.zeros(B, bool)
  drop[rng.choice(np.flatnonzero(leaf_rows(b)), 2, replace=False)] = True
  masked = run(dict(b, response_mask=b["response_mask"] & ~drop[:, None]))
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[~drop], run(slice_rows(b, drop)), rtol=1e-5, atol=1e-6)
  got = run(pad_columns(b))
  np.testing.assert_allclose(got[:, :T], want, rtol=1e-6, atol=1e-6)
  # Swapping two siblings (same node, both leaves) swaps their advantages.
  par, pre = b["parent_id"], b["prefix_len"]
  leaf = leaf_rows(b)
  pairs = [(i, j) for i in range(B) for j in range(i + 1, B)
           if par[i] >= 0 and par[i] == par[j] and pre[i] == pre[j] and leaf[i] and leaf[j]]
  if pairs:
    i, j = pairs[0]
    perm = np.arange(B)
    perm[[i, j]] = perm[[j, i]]
    sw = run({k: v[perm] for k, v in b.items()})
    np.testing.assert_allclose(sw, want[perm], rtol=1e-6, atol=1e-6)
  same = run(dict(b, reward=np.full(B, 1.0, np.float32)))
  assert np.all(same == 0)


def test_jit_equals_eager():
  b = make_tree(7)
  np.testing.assert_allclose(np.asarray(slate.slate_advantages(**b, num_groups=NG)), run(b),
                             rtol=1e-6, atol=1e-6)


PICK = jax.jit(slate.slate_pick)


def test_pick_one_per_node_and_argmax():
  adv = np.array([0.5, 1.0, 1.0, -1.0, 3.0, 0.0], np.float32)
  node = np.array([0, 0, 0, 1, 1, 2], np.int32)
  for eta in (0.0, -1.0):
    chosen = np.asarray(PICK(jax.random.key(0), adv, node, eta))
    assert chosen.tolist() == [False, True, False, False, True, True]   # ties: lowest row
  valid = np.array([1, 0, 1, 1, 1, 0], bool)
  chosen = np.asarray(PICK(jax.random.key(0), adv, node, 0.0, valid))
  assert chosen.tolist() == [False, False, True, False, True, False]
  for s in range(5):
    chosen = np.asarray(PICK(jax.random.key(s), adv, node, 0.7))
    assert [chosen[node == n].sum() for n in range(3)] == [1, 1, 1]


def test_pick_frequencies_follow_softmax():
  adv = np.array([0.920357, 0.153393, -0.613572, -1.380536, 0.920357], np.float32)
  node = np.zeros(5, np.int32)
  keys = jax.random.split(jax.random.key(1), 4000)
  picks = np.asarray(jax.jit(jax.vmap(slate.slate_pick, (0, None, None, None)))(
      keys, adv, node, 0.7))
  freq = picks.mean(0)
  p = np.exp(adv / 0.7)
  np.testing.assert_allclose(freq, p / p.sum(), atol=0.03)


def test_node_ids():
  b = make_tree(4)
  nid = np.asarray(slate.slate_node_ids(b["parent_id"], b["prefix_len"], b["group_id"]))
  par, pre = b["parent_id"], b["prefix_len"]
  for i in range(B):
    for j in range(B):
      same = (par[i] == par[j] and pre[i] == pre[j]) if par[i] >= 0 else (
          par[j] < 0 and b["group_id"][i] == b["group_id"][j])
      assert (nid[i] == nid[j]) == same
