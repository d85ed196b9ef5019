"""TreeRL (credit/advantages/tree/treerl.py): R(s) = (GA + LA)/√|L(s)| per tree segment.

The numpy reference builds the segment tree explicitly, as the authors' `build_into_tree_format`
does (a row cut at the columns its branches depart from; a branch's first segment hangs under
the parent's segment that ends there), and computes leaf means recursively.
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
from credit.advantages.tree import treerl
from tests.advantages.tree.cbpo_test import (B, NG, SETTINGS, T, leaf_rows, make_tree,
                                             pad_columns, slice_rows)

FIELDS = ("reward", "group_id", "response_mask", "parent_id", "prefix_len")


def ref_treerl(b, global_weight=1.0, local_weight=1.0, reweight="sqrt"):
  r = b["reward"].astype(np.float64)
  mask, par, pre, g = b["response_mask"], b["parent_id"], b["prefix_len"], b["group_id"]
  valid = mask.any(1)
  Bt, Tt = mask.shape
  kids = {a: [c for c in range(Bt) if par[c] == a] for a in range(Bt)}

  def subtree_has_leaf(c):
    return valid[c] or any(subtree_has_leaf(d) for d in kids[c])

  # Segment nodes: (row, start, end); children lists; leaves (rows) under each.
  segs, parent_of, leaves = [], {}, {}
  first_seg = {}

  def build(a, parent_seg):
    cuts = sorted({int(pre[c]) for c in kids[a] if subtree_has_leaf(c)})
    bounds = [int(pre[a])] + cuts + [Tt]
    ids = []
    for i in range(len(bounds) - 1):
      sid = len(segs)
      segs.append((a, bounds[i], bounds[i + 1]))
      parent_of[sid] = parent_seg if i == 0 else ids[-1]
      ids.append(sid)
    first_seg[a] = ids[0]
    for c in kids[a]:
      # The parent segment of c's first segment is the one that ends at prefix_len[c].
      end_at = [s for s in ids if segs[s][2] == pre[c]]
      build(c, end_at[0] if end_at else ids[-1])
    return ids

  roots = [a for a in range(Bt) if par[a] < 0]
  for a in roots:
    build(a, ("root", int(g[a])))

  def leaves_of(sid):
    if sid in leaves:
      return leaves[sid]
    a, s, e = segs[sid]
    out = [a] if (e == Tt and valid[a]) else []
    for k, p in parent_of.items():
      if p == sid:
        out += leaves_of(k)
    leaves[sid] = out
    return out

  v_root = {int(gg): r[valid & (g == gg)].mean() for gg in np.unique(g[valid])}
  out = np.zeros(mask.shape)
  for sid, (a, s, e) in enumerate(segs):
    if not valid[a]:
      continue
    lv = leaves_of(sid)
    v = r[lv].mean()
    p = parent_of[sid]
    vp = v_root[int(g[a])] if isinstance(p, tuple) else r[leaves_of(p)].mean()
    x = global_weight * (v - v_root[int(g[a])]) + local_weight * (v - vp)
    n = len(lv)
    x = x / {"sqrt": np.sqrt(n), "uniform": n, "none": 1.0}[reweight]
    sel = np.zeros(Tt, bool)
    sel[s:e] = True
    out[a, sel & mask[a]] = x
  return out


@functools.lru_cache(maxsize=None)
def jitted(**kw):
  return jax.jit(functools.partial(treerl.treerl_advantages, num_groups=NG, **kw))


def run(b, **kw):
  return np.asarray(jitted(**kw)(**{k: b[k] for k in FIELDS}), np.float64)


def test_registered():
  spec = registry.get_estimator("treerl")
  assert spec.family == "tree" and spec.confidence == "paper-equation"
  assert spec.needs == set(FIELDS)



def test_worked_example():
  # Roots 0 (r=1) and 1 (r=0); row 0 branched at column 3 into rows 2 (r=0) and 3 (r=1).
  # V(root) = 1/2. Row 0 [1,3): L = {0,2,3}, V = 2/3, GA = LA = 1/6, R = (1/3)/√3.
  # Row 0 [3,5): L = {0}, V = 1, GA = 1/2, LA = 1/3, R = 5/6. Row 2: V = 0, GA = −1/2,
  # LA = −2/3 → −7/6. Row 1 (a chain): 2·(0 − 1/2) = −1.
  mask = np.zeros((4, 5), bool)
  mask[:2, 1:] = True
  mask[2:, 3:] = True
  b = {"reward": np.array([1., 0, 0, 1], np.float32), "group_id": np.zeros(4, np.int32),
       "response_mask": mask, "parent_id": np.array([-1, -1, 0, 0], np.int32),
       "prefix_len": np.array([0, 0, 3, 3], np.int32)}
  a = np.asarray(treerl.treerl_advantages(**b, num_groups=1), np.float64)
  np.testing.assert_allclose(a[0], [0, 1 / 3 / np.sqrt(3)] * 1 + [1 / 3 / np.sqrt(3), 5 / 6,
                                                                   5 / 6], atol=1e-5)
  np.testing.assert_allclose(a[1], [0, -1, -1, -1, -1], atol=1e-5)
  np.testing.assert_allclose(a[2], [0, 0, 0, -7 / 6, -7 / 6], atol=1e-5)
  np.testing.assert_allclose(a[3], [0, 0, 0, 5 / 6, 5 / 6], atol=1e-5)
  np.testing.assert_allclose(a, ref_treerl(b), atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_matches_numpy_reference(seed):
  b = make_tree(seed)
  np.testing.assert_allclose(run(b), ref_treerl(b), rtol=1e-5, atol=1e-5)
  kw = dict(global_weight=0.0, local_weight=1.0, reweight="uniform")
  np.testing.assert_allclose(run(b, **kw), ref_treerl(b, **kw), rtol=1e-5, atol=1e-5)


def test_deep_tree_and_masked_parent():
  b = make_tree(11, nodes=5)                   # depth > 1 in this draw
  assert np.any(b["parent_id"][np.maximum(b["parent_id"], 0)] >= 0)
  np.testing.assert_allclose(run(b), ref_treerl(b), atol=1e-5)
  # A masked parent: its children stay leaves under its (uncredited) tokens.
  a = int(b["parent_id"][b["parent_id"] >= 0][0])
  m = dict(b, response_mask=b["response_mask"] & (np.arange(len(b["reward"])) != a)[:, None])
  got = run(m)
  assert np.all(got[a] == 0)
  np.testing.assert_allclose(got, ref_treerl(m), atol=1e-5)


GRPO = jax.jit(functools.partial(grpo_advantages, num_groups=NG, scale="none"))


@hypothesis.settings(**SETTINGS)
@hypothesis.given(r=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=4, max_size=4))
def test_flat_batch_is_twice_the_centred_reward(r):
  b = make_tree(0, nodes=0, k=0)
  b = dict(b, reward=np.asarray(r, np.float32))
  want = GRPO(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"])
  np.testing.assert_allclose(run(b), 2 * np.asarray(want), rtol=1e-6, atol=1e-6)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_masking_a_leaf_row_equals_slicing_it(seed):
  b = make_tree(seed)
  drop = np.zeros(B, bool)
  drop[np.random.default_rng(seed).choice(np.flatnonzero(leaf_rows(b)), 2, replace=False)] = True
  masked = run(dict(b, response_mask=b["response_mask"] & ~drop[:, None]))
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[~drop], run(slice_rows(b, drop)), rtol=1e-5, atol=1e-6)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000), value=st.sampled_from([0.0, 1.0, 0.3]))
def test_padding_and_degenerate(seed, value):
  b = make_tree(seed)
  got = run(pad_columns(b))
  np.testing.assert_allclose(got[:, :T], run(b), rtol=1e-6, atol=1e-6)
  assert np.all(got[:, T:] == 0)
  assert np.all(run(dict(b, reward=np.full(B, value, np.float32))) == 0)
  lone = make_tree(seed, k=1)
  out = run(lone)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, ref_treerl(lone), atol=1e-5)


def test_jit_equals_eager_and_bad_choice():
  b = make_tree(3)
  np.testing.assert_allclose(np.asarray(treerl.treerl_advantages(**b, num_groups=NG)), run(b),
                             rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="reweight"):
    treerl.treerl_advantages(**b, num_groups=NG, reweight="log")
