"""PROPA (credit/advantages/tree/propa.py); default = the authors' code (per-node GRPO on
log-boosted values), option `step_value_form=True` = ProRAG's form with MCTS step values.

Registry-wide properties (flat batches) also run in tests/registry_common_test.py.
"""
from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.tree import propa
from credit.contract import ContractError
from tests.advantages.tree import cbpo_test as tr
from tests.advantages.tree.prorag_test import B, G, K, N, T, make_batch

TREE_FIELDS = ("reward", "group_id", "response_mask", "parent_id", "prefix_len")
STEP_FIELDS = ("step_value", "step_mask", "step_id")
TSET = dict(max_examples=5, deadline=None)


# ---- default form: node GRPO on the tree --------------------------------------------------------


def boost_np(v, a=10.0):
  v = np.clip(np.asarray(v, np.float64), 0, 1)
  return np.log1p(a * v) / np.log1p(a)


def ref_node_grpo(b, eps=1e-4, min_span=0.1, a=10.0, num_groups=tr.NG):
  """Loops over the MCTS nodes of the tree, the code's rules (`create_GRPO_train_*.py`)."""
  r = b["reward"].astype(np.float64)
  m, par, pre, gid = b["response_mask"], b["parent_id"], b["prefix_len"], b["group_id"]
  n, T_ = m.shape
  valid = m.any(1) & (gid >= 0) & (gid < num_groups)
  kids = {i: [c for c in range(n) if par[c] == i] for i in range(n)}

  def subtree(c):
    out = [c]
    for k in kids[c]:
      out += subtree(k)
    return out

  def mean_valid(rows):
    rows = [i for i in rows if valid[i]]
    return np.mean(r[rows])

  def grpo(vals):      # vals: {key: raw value}; returns {key: advantage}
    x = {k: boost_np(v, a) for k, v in vals.items()}
    xs = np.array(list(x.values()))
    if (len(xs) < 2 or np.all(xs == 0) or np.all(xs == 1)
        or xs.max() - xs.min() < min_span):
      return {k: 0.0 for k in x}
    mu, sd = xs.mean(), xs.std(ddof=1)
    return {k: (v - mu) / (sd + eps) for k, v in x.items()}

  own, cont = np.zeros(n), {}
  for g in range(num_groups):                       # the prompt node: its roots
    roots = [i for i in range(n) if par[i] < 0 and gid[i] == g and valid[i]]
    for k, v in grpo({i: mean_valid(subtree(i)) for i in roots}).items():
      own[k] = v
  for (pa, p) in sorted({(par[c], pre[c]) for c in range(n) if par[c] >= 0 and valid[c]}):
    vals = {c: mean_valid(subtree(c)) for c in range(n)
            if par[c] == pa and pre[c] == p and valid[c]}
    if valid[pa]:
      later = [pa] + [d for k in kids[pa] if pre[k] > p for d in subtree(k)]
      vals["cont"] = mean_valid(later)
    adv = grpo(vals)
    cont[(pa, p)] = adv.pop("cont", 0.0)
    for k, v in adv.items():
      own[k] = v
  out = np.zeros((n, T_))
  for i in range(n):
    if not valid[i]:
      continue
    for t in range(T_):
      if m[i, t]:
        pts = [p for (pa, p) in cont if pa == i and p <= t]
        out[i, t] = cont[(i, max(pts))] if pts else own[i]
  return out


@functools.lru_cache(maxsize=None)
def jit_tree(num_groups=tr.NG, **kw):
  return jax.jit(functools.partial(propa.propa_advantages, num_groups=num_groups, **kw))


def run(b, **kw):
  return np.asarray(jit_tree(**kw)(**{k: b[k] for k in TREE_FIELDS}))


def test_registered():
  spec = registry.get_estimator("propa")
  assert spec.family == "tree" and spec.confidence == "code-verified"
  assert spec.needs == set(TREE_FIELDS)
  assert spec.needs_for({"step_value_form": True}) == set(TREE_FIELDS + STEP_FIELDS)



def test_worked_example_by_hand():
  # Roots 0, 1 (prompt node); row 0 branches at column 3 into rows 2, 3. Rewards 1, 0, 0, 1.
  # Prompt node: V(0) = mean(1, 0, 1) = 2/3, V(1) = 0 → x = log(1 + 20/3)/log 11, 0:
  #   mean x/2, unbiased std x/√2 → A = ±(x/2)/(x/√2 + 1e-4).
  # Node (0, 3): row 0's continuation V = 1, rows 2, 3: V = 0, 1 → x = 1, 0, 1:
  #   mean 2/3, std √(1/3) → A = (1/3)/(√(1/3) + 1e-4), −(2/3)/(…), (1/3)/(…).
  mask = np.zeros((4, 6), bool)
  mask[:2, 1:] = True
  mask[2:, 3:] = True
  b = dict(reward=np.array([1., 0, 0, 1], np.float32), group_id=np.zeros(4, np.int32),
           response_mask=mask, parent_id=np.array([-1, -1, 0, 0], np.int32),
           prefix_len=np.array([0, 0, 3, 3], np.int32))
  x = np.log(1 + 20 / 3) / np.log(11)
  ar = (x / 2) / (x / np.sqrt(2) + 1e-4)
  s = np.sqrt(1 / 3) + 1e-4
  want = np.array([[0, ar, ar, 1 / 3 / s, 1 / 3 / s, 1 / 3 / s], [0] + [-ar] * 5,
                   [0, 0, 0] + [-2 / 3 / s] * 3, [0, 0, 0] + [1 / 3 / s] * 3])
  got = np.asarray(propa.propa_advantages(**b, num_groups=1))
  np.testing.assert_allclose(got, want, atol=1e-5)
  np.testing.assert_allclose(got, ref_node_grpo(b, num_groups=1), atol=1e-5)
  # The skip rule: rewards .95/.98 on the node → boosted span < 0.1 → node gives 0.
  near = dict(b, reward=np.array([1., 0, .95, .98], np.float32))
  got = np.asarray(propa.propa_advantages(**near, num_groups=1))
  assert np.all(got[2:] == 0) and np.all(got[0, 3:] == 0) and got[0, 1] > 0


@hypothesis.settings(**TSET)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_matches_numpy_reference_on_trees(seed):
  b = tr.make_tree(seed)
  np.testing.assert_allclose(run(b), ref_node_grpo(b), rtol=1e-4, atol=1e-5)
  hp = dict(min_span=0.0, boost_a=3.0)
  # min_span = 0 keeps all-equal nodes (not 0/1): float32 noise / (0 + 1e-4) there.
  np.testing.assert_allclose(run(b, **hp), ref_node_grpo(b, min_span=0.0, a=3.0),
                             rtol=1e-4, atol=1e-3)


@hypothesis.settings(**TSET)
@hypothesis.given(r=st.lists(st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.0]), min_size=4,
                             max_size=4))
def test_flat_batch_is_grpo_on_log_boost_with_the_skip_rule(r):
  b = tr.make_tree(0, nodes=0)              # 2 groups × 2 roots, no branches
  b["reward"] = np.asarray(r, np.float32)
  got = run(b)
  x = boost_np(r)
  want = np.zeros(4)
  for g in range(tr.NG):
    sel = b["group_id"] == g
    xs = x[sel]
    if not (np.all(xs == 0) or np.all(xs == 1) or xs.max() - xs.min() < 0.1):
      want[sel] = (xs - xs.mean()) / (xs.std(ddof=1) + 1e-4)
  np.testing.assert_allclose(got, np.where(b["response_mask"], want[:, None], 0.0),
                             rtol=1e-5, atol=1e-5)


@hypothesis.settings(**TSET)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_masking_a_leaf_equals_slicing_it_and_padding(seed):
  b = tr.make_tree(seed)
  leaves = np.flatnonzero(tr.leaf_rows(b))
  drop = np.zeros(tr.B, bool)
  drop[np.random.default_rng(seed).choice(leaves, 2, replace=False)] = True
  masked = run(dict(b, response_mask=b["response_mask"] & ~drop[:, None]))
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[~drop], run(tr.slice_rows(b, drop)), rtol=1e-5, atol=1e-6)
  got = run(tr.pad_columns(b))
  np.testing.assert_allclose(got[:, :tr.T], run(b), rtol=1e-6, atol=1e-6)
  assert np.all(got[:, tr.T:] == 0)


def test_jit_eager_degenerate_and_validation():
  b = tr.make_tree(5)
  eager = np.asarray(propa.propa_advantages(**b, num_groups=tr.NG))
  np.testing.assert_allclose(eager, run(b), rtol=1e-6, atol=1e-6)
  for v in (0.0, 1.0, 0.4):                 # all-equal rewards: every node skipped
    assert np.all(run(dict(b, reward=np.full(tr.B, v, np.float32))) == 0)
  assert np.all(run(dict(b, response_mask=np.zeros_like(b["response_mask"]))) == 0)
  g = jax.grad(lambda r: jit_tree()(**dict({k: b[k] for k in TREE_FIELDS}, reward=r)).sum())(
      b["reward"])
  assert np.all(np.isfinite(np.asarray(g)))
  propa.validate_propa_inputs(**b, num_groups=tr.NG)
  bad = dict(b, parent_id=np.where(np.arange(tr.B) == 5, 7, b["parent_id"]).astype(np.int32))
  with pytest.raises(ValueError, match="parent_id"):
    propa.validate_propa_inputs(**bad, num_groups=tr.NG)
  with pytest.raises(ValueError, match="parent_id"):
    propa.propa_advantages(**{k: b[k] for k in TREE_FIELDS if k != "parent_id"},
                           num_groups=tr.NG)


# ---- option: the step-value form ---------------------------------------------------------


@functools.lru_cache(maxsize=None)
def jitted(group_size=None, **kw):
  return jax.jit(functools.partial(propa.propa_advantages, num_groups=N,
                                   group_size=group_size, step_value_form=True, **kw))


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


def test_spec_example_step_weighted():
  # B8's numbers with Q in place of the PRM score; stats over the 3 valid steps
  # (0.9, 0.2, 0.5): μ = 0.533333, σ = sqrt(0.082222 + 1e-8) = 0.286744.
  a = propa.propa_advantages(
      step_value_form=True, reward=np.array([1.0, 0.0]),
      step_value=np.array([[0.9, 0.2], [0.5, 0.0]]),
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
    propa.propa_advantages(**b, num_groups=N, step_value_form=True,
                           value_transform="exp")


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
  a_step = np.asarray(propa.propa_advantages(step_value=v, step_value_form=True, **kw))
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
  propa.validate_propa_inputs(**b, num_groups=N, step_value_form=True)
  with pytest.raises(ContractError, match="step_value"):
    propa.validate_propa_inputs(**dict(b, step_value=np.full((B, K), np.nan, np.float32),
                                       step_mask=np.ones((B, K), bool)), num_groups=N,
                                      step_value_form=True)
  with pytest.raises(ContractError, match="group_id"):
    propa.validate_propa_inputs(**b, num_groups=1, step_value_form=True)


@pytest.mark.parametrize("seed", [0, 11, 21])
def test_node_values_reach_tokens_as_by_a_search(seed):
  # The cumulative sum of steps between node values equals reading the node of the last
  # branch point at or before each column (the previous search and gather), to rounding.
  import jax.numpy as jnp
  from credit.trees import first_of_node, segment_starts, sibling_matrix, tree_layout
  b = tr.make_tree(seed, nodes=5)
  tree = tree_layout("test", b["reward"], b["group_id"], b["response_mask"], b["parent_id"],
                     b["prefix_len"], tr.NG)
  Bt, Tt = tree.mask.shape
  rng = np.random.default_rng(seed)
  own = jnp.asarray(rng.normal(size=Bt).astype(np.float32))
  as_parent = jnp.asarray(np.where(rng.random(Bt) < 0.3, 0.0, rng.normal(size=Bt)), jnp.float32)
  first = first_of_node(sibling_matrix(tree), tree.valid)
  got = propa._node_values_to_tokens(tree, first, own, as_parent)
  _, start = segment_starts(tree, first, Tt)
  table = jnp.zeros((Bt, Tt)).at[jnp.where(first & tree.child, tree.parent, Bt),
                                 jnp.clip(tree.prefix, 0, Tt - 1)].set(as_parent, mode="drop")
  want = jnp.where(start >= 0, jnp.take_along_axis(table, jnp.clip(start, 0, Tt - 1), axis=1),
                   own[:, None])
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
  assert np.asarray(start).max() > 0
