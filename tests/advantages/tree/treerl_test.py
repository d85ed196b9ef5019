"""TreeRL (credit/advantages/tree/treerl.py): per-segment credit from the leaves below.

Two numpy references:
* `ref_treerl_code` transcribes the authors' node recursion (THUDM/TreeRL `tree_node.py`
  `build_into_tree_format` → `leaf_normalize` → `selected_backpropagate` /
  `compute_weighted_update`, then `parallel_mcts.py` `path_from_root_to_node` → `fill_in_paths`
  → `gather_paths` with `use_state_value_reward`) on explicit node objects, path by path;
* `ref_treerl` builds the same segment tree and computes the paper's (GA + LA)/√|L(s)|.
"""
from __future__ import annotations

import doctest
import functools
import math

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
OMEGA = {"sqrt": math.sqrt, "uniform": float, "none": lambda n: 1.0}


# ---- the code's node recursion, transcribed ------------------------------------------------


class Node:
  """An MCTSNode of `build_into_tree_format`: a run of columns [start, end) of one row."""

  def __init__(self, row, start, end, parent, terminal=False, reward=0.0):
    self.row, self.start, self.end, self.parent = row, start, end, parent
    self.children, self.terminal, self.reward = [], terminal, reward
    self.acc, self.n_term, self.n_sel = 0.0, 0, 0


def ref_treerl_code(b, global_weight=1.0, local_weight=1.0, reweight="sqrt", fill_tol=1e-6):
  r = b["reward"].astype(np.float64)
  mask, par, pre, g = b["response_mask"], b["parent_id"], b["prefix_len"], b["group_id"]
  valid = mask.any(1)
  Bt, Tt = mask.shape
  kids = {a: [c for c in range(Bt) if par[c] == a] for a in range(Bt)}

  def has_leaf(c):
    return valid[c] or any(has_leaf(d) for d in kids[c])

  out = np.full(mask.shape, np.nan)
  for gg in np.unique(g):
    leaves = []

    def build(a, parent):                     # build_tree_node, on columns of row a
      ch = sorted((c for c in kids[a] if has_leaf(c)), key=lambda c: pre[c])
      splits = [int(pre[c]) for c in ch]
      first = splits[0] if splits else Tt
      node = Node(a, int(pre[a]), first, parent, terminal=not splits and valid[a],
                  reward=r[a])
      cur, i, start = node, 0, first
      while i < len(ch):
        group, split = [], splits[i]
        while i < len(ch) and splits[i] == split:   # the branches departing at one column
          group.append(ch[i])
          i += 1
        nxt = splits[i] if i < len(ch) else Tt
        seg = Node(a, start, nxt, cur, terminal=i == len(ch) and valid[a], reward=r[a])
        cur.children.append(seg)
        for c in group:
          cur.children.append(build(c, cur))
        start, cur = nxt, seg
      return node

    root = Node(-1, 0, 0, None)
    for a in np.flatnonzero((par < 0) & (g == gg)):
      if has_leaf(a):
        root.children.append(build(int(a), root))

    def collect(n):
      if n.terminal:
        leaves.append(n)
      for c in n.children:
        collect(c)

    collect(root)
    if not leaves:
      continue
    # leaf_normalize (a lone leaf: the code asserts; ours gives 0) + leaf_backpropagate.
    tot, num = sum(x.reward for x in leaves), len(leaves) - 1
    for x in leaves:
      x.acc = x.reward - (tot - x.reward) / num if num else 0.0
      x.n_term += 1
      p = x.parent
      while p is not None:
        p.n_term += 1
        p.acc += x.acc
        p = p.parent
    # every leaf selected (use_all_terminals): selected_backpropagate, compute_weighted_update.
    for x in leaves:
      p = x
      while p is not None:
        p.n_sel += 1
        p = p.parent

    def weight(n):
      if n.n_sel == 0:
        return
      n.acc /= OMEGA[reweight](n.n_sel)
      for c in n.children:
        weight(c)

    weight(root)
    for x in leaves:                          # path_from_root_to_node, fill_in_paths, gather
      path, n = [], x
      while n.parent is not None:
        v = n.acc / n.n_term
        path.append([n, v - n.parent.acc / n.parent.n_term, v])
        n = n.parent
      path = path[::-1]
      for i in range(1, len(path)):
        if abs(path[i][1]) < fill_tol:
          path[i][1] = path[i - 1][1]
      for n, value, state in path:
        reward = local_weight * value + global_weight * state
        cols = np.zeros(Tt, bool)
        cols[n.start:n.end] = True
        cols &= mask[n.row]
        prev = out[n.row, cols]
        assert np.all(np.isnan(prev) | np.isclose(prev, reward)), "paths disagree on a node"
        out[n.row, cols] = reward
  return np.where(np.isnan(out), 0.0, out)


# ---- the paper's equation on the same segment tree ------------------------------------------


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

  def build(a, parent_seg):
    cuts = sorted({int(pre[c]) for c in kids[a] if subtree_has_leaf(c)})
    bounds = [int(pre[a])] + cuts + [Tt]
    ids = []
    for i in range(len(bounds) - 1):
      sid = len(segs)
      segs.append((a, bounds[i], bounds[i + 1]))
      parent_of[sid] = parent_seg if i == 0 else ids[-1]
      ids.append(sid)
    for c in kids[a]:
      # The parent segment of c's first segment is the one that ends at prefix_len[c].
      end_at = [s for s in ids if segs[s][2] == pre[c]]
      build(c, end_at[0] if end_at else ids[-1])
    return ids

  for a in [a for a in range(Bt) if par[a] < 0]:
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
    x = x / OMEGA[reweight](len(lv))
    sel = np.zeros(Tt, bool)
    sel[s:e] = True
    out[a, sel & mask[a]] = x
  return out


REFS = {"code": ref_treerl_code, "paper": ref_treerl}


@functools.lru_cache(maxsize=None)
def jitted(**kw):
  return jax.jit(functools.partial(treerl.treerl_advantages, num_groups=NG, **kw))


def run(b, **kw):
  return np.asarray(jitted(**kw)(**{k: b[k] for k in FIELDS}), np.float64)


def test_registered():
  spec = registry.get_estimator("treerl")
  assert spec.family == "tree" and spec.confidence == "code-verified"
  assert spec.needs == set(FIELDS)


def _small_tree():
  # Roots 0 (r=1) and 1 (r=0); row 0 branched at column 3 into rows 2 (r=0) and 3 (r=1).
  mask = np.zeros((4, 5), bool)
  mask[:2, 1:] = True
  mask[2:, 3:] = True
  return {"reward": np.array([1., 0, 0, 1], np.float32), "group_id": np.zeros(4, np.int32),
          "response_mask": mask, "parent_id": np.array([-1, -1, 0, 0], np.int32),
          "prefix_len": np.array([0, 0, 3, 3], np.int32)}


def test_worked_example_code():
  # N = 4, c = r − (2 − r)/3 = ±2/3. Row 0 [0,3): L = {0,2,3}, Σc = 2/3, V = (2/3)/(3√3),
  # V(root) = 0, R = D + V = 2V. Row 0 [3,5): V = 2/3, R = (2/3 − V₀) + 2/3. Row 2: V = −2/3,
  # R = (−2/3 − V₀) − 2/3. Row 1 (a chain): R = 2c = −4/3.
  b = _small_tree()
  a = np.asarray(treerl.treerl_advantages(**b, num_groups=1), np.float64)
  v0 = (2 / 3) / (3 * np.sqrt(3))
  np.testing.assert_allclose(a[0], [0, 2 * v0, 2 * v0, 4 / 3 - v0, 4 / 3 - v0], atol=1e-6)
  np.testing.assert_allclose(a[1], [0, -4 / 3, -4 / 3, -4 / 3, -4 / 3], atol=1e-6)
  np.testing.assert_allclose(a[2], [0, 0, 0, -4 / 3 - v0, -4 / 3 - v0], atol=1e-6)
  np.testing.assert_allclose(a[3], a[0] * [0, 0, 0, 1, 1], atol=1e-6)
  np.testing.assert_allclose(a, ref_treerl_code(b), atol=1e-6)


def test_worked_example_code_fill_in():
  # Rows (r): 0 root (.5), 1 ← 0 at col 2 (1), 2 ← 0 at col 4 (1), 3 ← 2 at col 6 (0),
  # 4 root (0), 5 ← 0 at col 7 (.5). N = 6, mean .5, c = 1.2·(r − .5) = [0,.6,.6,−.6,−.6,0].
  # Row 0 [0,2): L = {0,1,2,3,5}, Σc = .6, V₀ = .6/(5√5), top: D = V₀, R = 2V₀.
  # Row 1: V = .6, R = (.6 − V₀) + .6. Row 0 [2,4): L = {0,2,3,5}, V = 0, D = −V₀, R = −V₀.
  # Zero D, filled from the parent: row 0 [4,7) (L = {0,5}), row 0 [7,10) and row 5 (a chain
  # of fills), row 2 [4,6) (L = {2,3}): all R = 0 + (−V₀). Row 2 [6,10): 1.2; row 3: −1.2;
  # row 4 (root chain): 2c = −1.2.
  mask = np.zeros((6, 10), bool)
  for row, (s, e) in enumerate([(1, 10), (2, 9), (4, 10), (6, 8), (1, 6), (7, 9)]):
    mask[row, s:e] = True
  b = {"reward": np.array([.5, 1, 1, 0, 0, .5], np.float32), "group_id": np.zeros(6, np.int32),
       "response_mask": mask, "parent_id": np.array([-1, 0, 0, 2, -1, 0], np.int32),
       "prefix_len": np.array([0, 2, 4, 6, 0, 7], np.int32)}
  a = np.asarray(treerl.treerl_advantages(**b, num_groups=1), np.float64)
  v0 = 0.6 / (5 * np.sqrt(5))
  want = np.zeros((6, 10))
  want[0, 1:2], want[0, 2:10] = 2 * v0, -v0
  want[1, 2:9] = 1.2 - v0
  want[2, 4:6], want[2, 6:10] = -v0, 1.2
  want[3, 6:8], want[4, 1:6], want[5, 7:9] = -1.2, -1.2, -v0
  np.testing.assert_allclose(a, want, atol=1e-6)
  np.testing.assert_allclose(a, ref_treerl_code(b), atol=1e-6)
  # Without the fill-in those segments keep D = 0: R = V = 0.
  off = np.asarray(treerl.treerl_advantages(**b, num_groups=1, fill_tol=0.0), np.float64)
  want[0, 4:10], want[2, 4:6], want[5, 7:9] = 0, 0, 0
  np.testing.assert_allclose(off, want, atol=1e-6)
  np.testing.assert_allclose(off, ref_treerl_code(b, fill_tol=0.0), atol=1e-6)


def test_worked_example_paper():
  # V(root) = 1/2. Row 0 [1,3): L = {0,2,3}, V = 2/3, GA = LA = 1/6, R = (1/3)/√3.
  # Row 0 [3,5): L = {0}, V = 1, GA = 1/2, LA = 1/3, R = 5/6. Row 2: V = 0, GA = −1/2,
  # LA = −2/3 → −7/6. Row 1 (a chain): 2·(0 − 1/2) = −1.
  b = _small_tree()
  a = np.asarray(treerl.treerl_advantages(**b, num_groups=1, form="paper"), np.float64)
  x = 1 / 3 / np.sqrt(3)
  np.testing.assert_allclose(a[0], [0, x, x, 5 / 6, 5 / 6], atol=1e-5)
  np.testing.assert_allclose(a[1], [0, -1, -1, -1, -1], atol=1e-5)
  np.testing.assert_allclose(a[2], [0, 0, 0, -7 / 6, -7 / 6], atol=1e-5)
  np.testing.assert_allclose(a[3], [0, 0, 0, 5 / 6, 5 / 6], atol=1e-5)
  np.testing.assert_allclose(a, ref_treerl(b), atol=1e-6)


OPTIONS = [dict(), dict(global_weight=0.0, local_weight=1.0, reweight="uniform"),
           dict(global_weight=0.5, local_weight=2.0, reweight="none")]


@pytest.mark.parametrize("form", ["code", "paper"])
@pytest.mark.parametrize("seed", range(4))
def test_matches_numpy_reference(seed, form):
  b = make_tree(seed)
  for kw in OPTIONS:
    np.testing.assert_allclose(run(b, form=form, **kw), REFS[form](b, **kw), rtol=1e-5,
                               atol=1e-5, err_msg=str(kw))


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000), rewards=st.sampled_from(
    [(0.0, 1.0), (0.0, 1.0, 0.5), (0.0, 0.25, 1.0, 2.0)]))
def test_code_form_matches_the_node_recursion(seed, rewards):
  b = make_tree(seed, nodes=4, rewards=rewards)
  np.testing.assert_allclose(run(b), ref_treerl_code(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [21, 30, 32])
def test_code_form_fill_in_on_random_trees(seed):
  # Draws where some segment below the top has D = 0 (found by search: about 1 in 10 draws
  # of this kind), so the fill-in changes the result.
  b = make_tree(seed, nodes=5, rewards=(0.0, 1.0, 0.5))
  want = ref_treerl_code(b)
  assert not np.allclose(want, ref_treerl_code(b, fill_tol=0.0))
  np.testing.assert_allclose(run(b), want, rtol=1e-5, atol=1e-5)


def test_deep_tree_and_masked_parent():
  b = make_tree(11, nodes=5)                   # depth > 1 in this draw
  assert np.any(b["parent_id"][np.maximum(b["parent_id"], 0)] >= 0)
  # A masked parent: its children stay leaves under its (uncredited) tokens.
  a = int(b["parent_id"][b["parent_id"] >= 0][0])
  m = dict(b, response_mask=b["response_mask"] & (np.arange(len(b["reward"])) != a)[:, None])
  for form in ("code", "paper"):
    np.testing.assert_allclose(run(b, form=form), REFS[form](b), atol=1e-5)
    got = run(m, form=form)
    assert np.all(got[a] == 0)
    np.testing.assert_allclose(got, REFS[form](m), atol=1e-5)


GRPO = jax.jit(functools.partial(grpo_advantages, num_groups=NG, scale="none"))


@hypothesis.settings(**SETTINGS)
@hypothesis.given(r=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=4, max_size=4))
def test_flat_batch(r):
  # Paper: 2·(r − μ). Code: 2·c = 2·N/(N−1)·(r − μ), N = 2 rows per group here.
  b = make_tree(0, nodes=0, k=0)
  b = dict(b, reward=np.asarray(r, np.float32))
  want = np.asarray(GRPO(reward=b["reward"], group_id=b["group_id"],
                         response_mask=b["response_mask"]))
  np.testing.assert_allclose(run(b, form="paper"), 2 * want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(run(b), 4 * want, rtol=1e-6, atol=1e-6)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_masking_a_leaf_row_equals_slicing_it(seed):
  b = make_tree(seed)
  drop = np.zeros(B, bool)
  drop[np.random.default_rng(seed).choice(np.flatnonzero(leaf_rows(b)), 2, replace=False)] = True
  for form in ("code", "paper"):
    masked = run(dict(b, response_mask=b["response_mask"] & ~drop[:, None]), form=form)
    assert np.all(masked[drop] == 0)
    np.testing.assert_allclose(masked[~drop], run(slice_rows(b, drop), form=form), rtol=1e-5,
                               atol=1e-6)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000), value=st.sampled_from([0.0, 1.0, 0.3]))
def test_padding_and_degenerate(seed, value):
  b = make_tree(seed)
  lone = make_tree(seed, k=1)
  for form in ("code", "paper"):
    got = run(pad_columns(b), form=form)
    np.testing.assert_allclose(got[:, :T], run(b, form=form), rtol=1e-6, atol=1e-6)
    assert np.all(got[:, T:] == 0)
    assert np.all(run(dict(b, reward=np.full(B, value, np.float32)), form=form) == 0)
    out = run(lone, form=form)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, REFS[form](lone), atol=1e-5)


def test_lone_leaf_group_is_zero():
  # The code asserts on a prompt with one leaf; here that group gets exact zeros.
  b = make_tree(5, nodes=0, k=0)
  m = b["response_mask"].copy()
  m[1] = False                                  # group 0 keeps row 0 only
  got = run(dict(b, response_mask=m, reward=np.array([1., 0, 1, 0], np.float32)))
  assert np.all(got[:2] == 0) and np.any(got[2:] != 0)


def test_docstring_example():
  assert doctest.testmod(treerl).failed == 0


def test_jit_equals_eager_and_bad_choice():
  b = make_tree(3)
  for form in ("code", "paper"):
    np.testing.assert_allclose(
        np.asarray(treerl.treerl_advantages(**b, num_groups=NG, form=form)), run(b, form=form),
        rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="reweight"):
    treerl.treerl_advantages(**b, num_groups=NG, reweight="log")
  with pytest.raises(ValueError, match="form"):
    treerl.treerl_advantages(**b, num_groups=NG, form="mcts")


# The previous token-level forms (one [B,T] array per quantity), kept to check the per-segment
# computation against: leaf sums from a histogram of exit columns, fill-in along path views.


def _old_leaf_values(tree):
  import jax.numpy as jnp
  from credit.advantages.tree._common import exit_columns
  Bt, Tt = tree.mask.shape
  e = jnp.clip(exit_columns(tree, Tt), 0, Tt)
  bins = (jnp.arange(Bt)[None, :] * (Tt + 1) + e).reshape(-1)
  w = jnp.broadcast_to(tree.valid[:, None], (Bt, Bt)).astype(jnp.float32)

  def per_column(x):
    h = jax.ops.segment_sum(x.reshape(-1), bins, Bt * (Tt + 1)).reshape(Bt, Tt + 1)
    return jax.lax.cumsum(h, axis=1, reverse=True)[:, 1:]

  return per_column(w * tree.reward[:, None]), per_column(w)


def _old_path_view(tree, x_BTC):
  import jax.numpy as jnp
  Bt, Tt = x_BTC.shape[:2]
  t_idx = jnp.arange(Tt)[None, :]

  def body(state):
    cur, hi, out = state
    on = cur >= 0
    safe = jnp.clip(cur, 0, Bt - 1)
    lo = tree.prefix[safe]
    take = on[:, None] & (t_idx >= lo[:, None]) & (t_idx < hi[:, None])
    out = jnp.where(take[:, :, None], x_BTC[safe], out)
    return jnp.where(on, tree.parent[safe], -1), jnp.where(on, lo, hi), out

  return jax.lax.while_loop(lambda s: jnp.any(s[0] >= 0), body,
                            (tree.parent, tree.prefix, x_BTC))[2]


def _old_code_form(tree, reweight, fill_tol):
  import jax.numpy as jnp
  from credit.trees import segment_starts
  Bt, Tt = tree.mask.shape
  same = ((tree.group_id[:, None] == tree.group_id[None, :])
          & tree.valid[:, None] & tree.valid[None, :])
  n_grp = jnp.sum(same, axis=1).astype(jnp.float32)
  diff = jnp.sum(jnp.where(same, tree.reward[:, None] - tree.reward[None, :], 0.0), axis=1)
  c = jnp.where(tree.valid & (n_grp >= 2), diff / jnp.maximum(n_grp - 1.0, 1.0), 0.0)
  total, count = _old_leaf_values(tree._replace(reward=c))
  n = jnp.maximum(count, 1.0)
  value = total / (n * treerl._weight(n, reweight))
  n_root = jnp.maximum(n_grp, 1.0)
  v_root = jnp.sum(jnp.where(same, c[None, :], 0.0), axis=1) / (
      n_root * treerl._weight(n_root, reweight))
  d = value - treerl._parent_segment(tree, value, count, v_root)
  has = count[jnp.arange(Bt), jnp.clip(tree.prefix, 0, Tt - 1)] > 0
  mark, _ = segment_starts(tree, has, Tt)
  t_idx = jnp.arange(Tt)[None, :]
  own_start = tree.child[:, None] & (t_idx == tree.prefix[:, None])
  path = _old_path_view(tree, jnp.stack([d, (mark | own_start).astype(jnp.float32)], axis=-1))
  d_path, b_path = path[..., 0], path[..., 1] > 0
  keep = ~jnp.cumsum(b_path, axis=1).astype(bool) | (jnp.abs(d_path) >= fill_tol)
  last = jax.lax.cummax(jnp.where(keep, t_idx, 0), axis=1)
  return jnp.take_along_axis(d_path, last, axis=1) + value


def _tree_rows(b):
  from credit.trees import tree_layout
  return tree_layout("test", b["reward"], b["group_id"], b["response_mask"], b["parent_id"],
                     b["prefix_len"], NG)


@pytest.mark.parametrize("seed", [3, 11, 21, 30])
def test_segment_form_equals_the_token_form(seed):
  from credit.advantages.tree._common import tree_leaf_values, tree_leaf_values_at
  b = make_tree(seed, nodes=5, rewards=(0.0, 1.0, 0.5, 0.25))
  b["response_mask"][1] = False                 # an invalid root with branches below
  tree = _tree_rows(b)
  new, old = tree_leaf_values(tree), _old_leaf_values(tree)
  for x, y in zip(new, old):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)
  rng = np.random.default_rng(seed)
  rows, cols = rng.integers(0, tree.mask.shape[0], 9), rng.integers(0, T, 9)
  at = tree_leaf_values_at(tree, jax.numpy.asarray(rows), jax.numpy.asarray(cols))
  for x, y in zip(at, old):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y)[rows, cols], rtol=1e-6, atol=1e-6)
  on = np.asarray(tree.mask & tree.valid[:, None])
  for reweight, tol in [("sqrt", 1e-6), ("uniform", 0.0), ("none", 0.05)]:
    got = treerl._code_form(tree, 1.0, 1.0, reweight, tol)
    want = _old_code_form(tree, reweight, tol)
    np.testing.assert_allclose(np.asarray(got)[on], np.asarray(want)[on], rtol=1e-5, atol=1e-6)
