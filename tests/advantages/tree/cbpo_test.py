"""CBPO (credit/advantages/tree/cbpo.py).

Also holds the random tree batches and the row-slicing helper the other tree tests share.
Registry-wide properties (flat batches) live in tests/registry_common_test.py.
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
from credit.advantages.tree import cbpo

FIELDS = ("reward", "group_id", "response_mask", "parent_id", "prefix_len")
NG, ROOTS, NODES, K, T = 2, 2, 3, 2, 12       # B = NG·ROOTS + NODES·K = 10
B = NG * ROOTS + NODES * K
SETTINGS = dict(max_examples=8, deadline=None)


# ---- random tree batches shared by the tree tests --------------------------------------------


def make_tree(seed: int, *, nodes: int = NODES, k: int = K, rewards=(0.0, 1.0, 0.5)) -> dict:
  """A tree batch in the `credit.trees` layout: NG·ROOTS roots (prompt of 1–2 columns), then
  `nodes` branch points, each with k contiguous sibling rows departing strictly inside the
  own tokens of an earlier row (depth > 1 happens)."""
  rng = np.random.default_rng(seed)
  n0 = NG * ROOTS
  Bt = n0 + nodes * k
  mask = np.zeros((Bt, T), bool)
  parent = np.full(Bt, -1, np.int32)
  prefix = np.zeros(Bt, np.int32)
  gid = np.repeat(np.arange(NG, dtype=np.int32), ROOTS)
  gid = np.concatenate([gid, np.zeros(nodes * k, np.int32)])
  for b in range(n0):
    start = int(rng.integers(1, 3))
    mask[b, start:int(rng.integers(start + 4, T + 1))] = True
  row = n0
  for _ in range(nodes):
    own = [a for a in range(row) if mask[a].sum() >= 2]
    a = int(rng.choice(own))
    cols = np.flatnonzero(mask[a])
    p = int(rng.choice(cols[1:]))
    for _ in range(k):
      parent[row], prefix[row], gid[row] = a, p, gid[a]
      mask[row, p:int(rng.integers(p + 1, T + 1))] = True
      row += 1
  reward = rng.choice(np.asarray(rewards, np.float32), Bt).astype(np.float32)
  return {"reward": reward, "group_id": gid, "response_mask": mask, "parent_id": parent,
          "prefix_len": prefix}


def leaf_rows(b: dict) -> np.ndarray:
  """Rows no other row branches from."""
  leaf = np.ones(len(b["parent_id"]), bool)
  leaf[b["parent_id"][b["parent_id"] >= 0]] = False
  return leaf


def slice_rows(b: dict, drop: np.ndarray) -> dict:
  """The batch without the rows in `drop` (rows nobody branches from), parents renumbered."""
  keep = ~drop
  new = np.cumsum(keep) - 1
  out = {k: v[keep] for k, v in b.items()}
  par = out["parent_id"]
  out["parent_id"] = np.where(par >= 0, new[np.maximum(par, 0)], -1).astype(np.int32)
  return out


def pad_columns(b: dict, pad: int = 3) -> dict:
  out = dict(b)
  out["response_mask"] = np.concatenate([b["response_mask"], np.zeros((len(b["reward"]), pad),
                                                                       bool)], 1)
  return out


def grpo_np(r, g, valid, eps=1e-6):
  out = np.zeros(len(r))
  for gg in np.unique(g[valid]):
    sel = valid & (g == gg)
    if sel.sum() > 1:
      out[sel] = (r[sel] - r[sel].mean()) / (r[sel].std(ddof=1) + eps)
  return out


# ---- numpy reference ---------------------------------------------------------------------------


def ref_cbpo(b, kappa=1.0, eps=1e-6):
  r = b["reward"].astype(np.float64)
  mask, par, pre, g = b["response_mask"], b["parent_id"], b["prefix_len"], b["group_id"]
  valid = mask.any(1)
  Bt = len(r)
  root = par < 0
  own = grpo_np(r, g, valid & root, eps)
  nodes = {}                                   # (a, p) -> valid branch rows
  for c in range(Bt):
    if par[c] >= 0 and valid[c]:
      nodes.setdefault((int(par[c]), int(pre[c])), []).append(c)

  def member_adv(key, m):
    a, _ = key
    members = nodes[key] + ([a] if valid[a] else [])
    x = r[members]
    return (r[m] - x.mean()) * (1 + kappa * x.std())

  for c in range(Bt):
    if par[c] >= 0 and valid[c]:
      own[c] = member_adv((int(par[c]), int(pre[c])), c)
  out = np.zeros(mask.shape)
  for a in range(Bt):
    if not valid[a]:
      continue
    points = sorted(p for (aa, p) in nodes if aa == a)
    for t in np.flatnonzero(mask[a]):
      before = [p for p in points if p <= t]
      out[a, t] = member_adv((a, before[-1]), a) if before else own[a]
  return out


@functools.lru_cache(maxsize=None)
def jitted(**kw):
  return jax.jit(functools.partial(cbpo.cbpo_advantages, num_groups=NG, **kw))


def run(b, **kw):
  return np.asarray(jitted(**kw)(**{k: b[k] for k in FIELDS}), np.float64)


# ---- tests -----------------------------------------------------------------------------------


def test_registered():
  spec = registry.get_estimator("cbpo")
  assert spec.family == "tree" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)



def test_spec_example():
  # Prompt group rewards [1,0,0,0] → A_root = [1.499997, −0.499999×3]; rollout 1 (r = 0)
  # branched at column 3, children [1,1,0]: node [0,1,1,0], a = ±0.5, CBV = 0.5 → ±0.75.
  mask = np.zeros((7, 6), bool)
  mask[:4, 1:] = True
  mask[4:, 3:] = True
  b = {"reward": np.array([1., 0, 0, 0, 1, 1, 0], np.float32),
       "group_id": np.zeros(7, np.int32), "response_mask": mask,
       "parent_id": np.array([-1, -1, -1, -1, 1, 1, 1], np.int32),
       "prefix_len": np.array([0, 0, 0, 0, 3, 3, 3], np.int32)}
  a = np.asarray(cbpo.cbpo_advantages(**b, num_groups=1))
  np.testing.assert_allclose(a[0, 1:], 1.499997, atol=1e-5)
  np.testing.assert_allclose(a[2, 1:], -0.499999, atol=1e-5)
  np.testing.assert_allclose(a[1, 1:3], -0.499999, atol=1e-5)   # own segment [1, 3)
  np.testing.assert_allclose(a[1, 3:], -0.75, atol=1e-5)        # parent member of the node
  np.testing.assert_allclose(a[4:, 3:], [[0.75] * 3, [0.75] * 3, [-0.75] * 3], atol=1e-5)
  assert np.all(a[4:, :3] == 0) and np.all(a[:, 0] == 0)        # copied prefix / prompt
  np.testing.assert_allclose(a, ref_cbpo(b), atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_matches_numpy_reference(seed):
  b = make_tree(seed)
  np.testing.assert_allclose(run(b), ref_cbpo(b), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(run(b, kappa=0.3), ref_cbpo(b, kappa=0.3), rtol=1e-5, atol=1e-5)


def test_several_nodes_on_one_row_and_depth():
  # Row 0 branches at 3 and at 5; row 4 (a branch of row 0) branches again at 7.
  mask = np.zeros((8, 10), bool)
  mask[:2, 1:] = True
  mask[2:4, 3:] = True
  mask[4:6, 5:] = True
  mask[6:8, 7:] = True
  b = {"reward": np.array([1., 0, 0, 1, 1, 0, 1, 1], np.float32),
       "group_id": np.zeros(8, np.int32), "response_mask": mask,
       "parent_id": np.array([-1, -1, 0, 0, 0, 0, 4, 4], np.int32),
       "prefix_len": np.array([0, 0, 3, 3, 5, 5, 7, 7], np.int32)}
  a = np.asarray(jax.jit(functools.partial(cbpo.cbpo_advantages, num_groups=1))(**b))
  np.testing.assert_allclose(a, ref_cbpo(b), atol=1e-5)
  # Row 0: [1,3) root GRPO (+0.707), [3,5) node {0,2,3}, [5,10) node {0,4,5}.
  np.testing.assert_allclose(a[0, 1:3], 0.5 / np.sqrt(0.5), atol=1e-5)
  x = np.array([1., 0, 1])
  np.testing.assert_allclose(a[0, 3:5], (1 - x.mean()) * (1 + x.std()), atol=1e-5)
  np.testing.assert_allclose(a[0, 5:], (1 - x.mean()) * (1 + x.std()), atol=1e-5)
  # Row 4: its own tokens [5,7) as a member of node {0,4,5}, [7,10) as the parent of {4,6,7}.
  np.testing.assert_allclose(a[4, 7:], 0.0, atol=1e-6)          # node rewards all 1
  # Each tree token is credited in exactly one row.
  assert np.all((a != 0).sum(0) <= mask.sum(0))


GRPO = jax.jit(functools.partial(grpo_advantages, num_groups=NG))


@hypothesis.settings(**SETTINGS)
@hypothesis.given(r=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=B, max_size=B))
def test_flat_batch_is_grpo(r):
  b = make_tree(0, nodes=0, k=0)
  b = dict(b, reward=np.asarray(r[:len(b["reward"])], np.float32))
  want = GRPO(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"])
  np.testing.assert_allclose(run(b), np.asarray(want), rtol=1e-6, atol=1e-6)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_masking_a_leaf_row_equals_slicing_it(seed):
  b = make_tree(seed)
  leaves = np.flatnonzero(leaf_rows(b))
  drop = np.zeros(B, bool)
  drop[np.random.default_rng(seed).choice(leaves, 2, replace=False)] = True
  masked = run(dict(b, response_mask=b["response_mask"] & ~drop[:, None]))
  assert np.all(masked[drop] == 0)
  sliced = run(slice_rows(b, drop))
  np.testing.assert_allclose(masked[~drop], sliced, rtol=1e-5, atol=1e-6)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_padding_invariance(seed):
  b = make_tree(seed)
  got = run(pad_columns(b))
  np.testing.assert_allclose(got[:, :T], run(b), rtol=1e-6, atol=1e-6)
  assert np.all(got[:, T:] == 0)


def test_jit_equals_eager():
  b = make_tree(5)
  eager = np.asarray(cbpo.cbpo_advantages(**b, num_groups=NG))
  np.testing.assert_allclose(eager, run(b), rtol=1e-6, atol=1e-6)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000), value=st.sampled_from([0.0, 1.0, 0.3]))
def test_degenerate_trees_finite(seed, value):
  b = make_tree(seed)
  same = run(dict(b, reward=np.full(B, value, np.float32)))
  assert np.all(same == 0)                                   # no spread anywhere
  lone = make_tree(seed, k=1)                                # singleton branches: node of 2
  out = run(lone)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, ref_cbpo(lone), atol=1e-5)
  assert np.all(np.isfinite(np.asarray(grad_sum(b))))


@jax.jit
def grad_sum(b):
  return jax.grad(lambda r: jax.numpy.sum(cbpo.cbpo_advantages(
      **dict(b, reward=r), num_groups=NG)))(b["reward"])


def test_invalid_trees_raise():
  b = make_tree(1)
  with pytest.raises(ValueError, match="earlier row"):
    cbpo.cbpo_advantages(**dict(b, parent_id=np.where(np.arange(B) == 5, 7, b["parent_id"])
                                .astype(np.int32)), num_groups=NG)
  with pytest.raises(ValueError, match="departs"):
    cbpo.cbpo_advantages(**dict(b, prefix_len=np.where(b["parent_id"] >= 0, 0,
                                                       b["prefix_len"]).astype(np.int32)),
                         num_groups=NG)
  with pytest.raises(ValueError, match="group"):
    cbpo.cbpo_advantages(**dict(b, group_id=np.where(np.arange(B) == B - 1, 1 - b["group_id"],
                                                     b["group_id"]).astype(np.int32)),
                         num_groups=NG)
  with pytest.raises(ValueError, match="root row"):
    cbpo.cbpo_advantages(**dict(b, prefix_len=np.where(np.arange(B) == 0, 2, b["prefix_len"])
                                .astype(np.int32)), num_groups=NG)
  with pytest.raises(ValueError, match="num_groups"):
    cbpo.cbpo_advantages(**b, num_groups=0)
