"""TreeRL: process credit from an on-policy tree, from the value of each segment's leaves."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.tree._common import (subtree_sums, tree_leaf_values,
                                           tree_leaf_values_at)
from credit.registry import register_estimator
from credit.trees import TreeRows, tree_layout

Array = jax.Array

__all__ = ["treerl_advantages", "tree_leaf_values"]

_PAPER = ("TreeRL: LLM Reinforcement Learning with On-Policy Tree Search (Hou et al., ACL 2025), "
          "arXiv 2506.11902; code https://github.com/THUDM/TreeRL")

REWEIGHTS = ("sqrt", "uniform", "none")
FORMS = ("code", "paper")


def _parent_segment(tree: TreeRows, x_BT: Array, count_BT: Array, root_B: Array) -> Array:
  """[B,T]: x of the parent segment of the segment holding token (a, t).

  Segments of row a start where its leaf count changes (a branch with a valid leaf departs);
  the parent of a later segment is the previous one of the row (x at start − 1), of a
  branch's first segment the parent row's segment ending at prefix_len, of a root's first
  segment the group root (`root_B`).
  """
  B, T = x_BT.shape
  t_idx = jnp.arange(T, dtype=jnp.int32)[None, :]
  change = jnp.concatenate([jnp.zeros((B, 1), bool), count_BT[:, 1:] != count_BT[:, :-1]],
                           axis=1)
  start = jax.lax.cummax(jnp.where(change, t_idx, -1), axis=1)
  before = jnp.take_along_axis(x_BT, jnp.clip(start - 1, 0, T - 1), axis=1)
  par = jnp.clip(tree.parent, 0, B - 1)
  entry = jnp.where(tree.child, x_BT[par, jnp.clip(tree.prefix - 1, 0, T - 1)], root_B)
  return jnp.where(start >= 1, before, entry[:, None])


def _weight(n: Array, reweight: str) -> Array:
  """ω(n) of `compute_weighted_update`: √n, n or 1 (n >= 1)."""
  if reweight == "sqrt":
    return jnp.sqrt(n)
  if reweight == "uniform":
    return n
  return jnp.ones_like(n)


def _last_break_before(bp_B: Array, tree: TreeRows, row_Q: Array, col_Q: Array) -> Array:
  """[Q] piece of the last break point of row_Q[q] strictly before col_Q[q]: B + c for the
  break point of branch row c, or row_Q[q] itself (the row's first segment) when none."""
  B = bp_B.shape[0]
  before_QB = (bp_B[None, :] & (tree.parent[None, :] == row_Q[:, None])
               & (tree.prefix[None, :] < col_Q[:, None]))
  # One max over the keys prefix_len·B + c (unique; columns < T) finds c and whether any.
  key_B = tree.prefix * B + jnp.arange(B, dtype=jnp.int32)
  last_Q = jnp.max(jnp.where(before_QB, key_B[None, :], -1), axis=1)
  return jnp.where(last_Q >= 0, B + last_Q % B, row_Q)


def _code_form(tree: TreeRows, global_weight, local_weight, reweight: str, fill_tol) -> Array:
  """The code's R(s) on every token, computed per segment.

  Segments ("pieces") are the first segment of every row a (index a) and the segment that
  starts at the break point (parent(c), prefix_len(c)) of a branch row c whose node has a
  valid leaf below (index B + c, one c per node): 2B pieces. V, D, the fill-in D̃ and R are
  computed on pieces; tokens then read R from a [B, B+1] table (row, number of the row's
  break points at or before the column).
  """
  B, T = tree.mask.shape
  rows = jnp.arange(B, dtype=jnp.int32)
  # Leave-one-out centred leaf reward, from pairwise differences (exact 0 on equal rewards).
  same = ((tree.group_id[:, None] == tree.group_id[None, :])
          & tree.valid[:, None] & tree.valid[None, :])
  n_grp = jnp.sum(same, axis=1).astype(jnp.float32)                   # N of the row's group
  diff = jnp.sum(jnp.where(same, tree.reward[:, None] - tree.reward[None, :], 0.0), axis=1)
  c = jnp.where(tree.valid & (n_grp >= 2), diff / jnp.maximum(n_grp - 1.0, 1.0), 0.0)
  tree_c = tree._replace(reward=c)
  n_root = jnp.maximum(n_grp, 1.0)
  v_root = jnp.sum(jnp.where(same, c[None, :], 0.0), axis=1) / (n_root * _weight(n_root, reweight))
  sub_B2 = subtree_sums(tree_c)
  # Break points: the nodes (parent, prefix_len) with a valid leaf below, one branch row each.
  branch = tree.child & (tree.prefix >= 1) & (tree.prefix < T)
  node_BB = ((tree.parent[:, None] == tree.parent[None, :])
             & (tree.prefix[:, None] == tree.prefix[None, :]) & branch[:, None] & branch[None, :])
  node_count = jnp.sum(jnp.where(node_BB, sub_B2[None, :, 1], 0.0), axis=1)
  first = branch & ~jnp.any(node_BB & (rows[None, :] < rows[:, None]), axis=1)
  bp = first & (node_count > 0)
  # Pieces: V from the leaf sums at their first column, D against the previous piece.
  row_P = jnp.concatenate([rows, jnp.clip(tree.parent, 0, B - 1)])
  col_P = jnp.concatenate([tree.prefix, tree.prefix])
  total, count = tree_leaf_values_at(tree_c, row_P, col_P, sub_B2)
  n = jnp.maximum(count, 1.0)
  value_P = total / (n * _weight(n, reweight))
  prev_P = _last_break_before(bp, tree, jnp.concatenate([jnp.clip(tree.parent, 0, B - 1),
                                                          row_P[B:]]), col_P)
  top_P = jnp.concatenate([~tree.child, jnp.zeros((B,), bool)])        # a root's first piece
  parent_v = jnp.where(top_P, jnp.concatenate([v_root, v_root]), value_P[prev_P])
  d_P = value_P - parent_v
  # Fill-in: a piece with |D| < tol below the top one takes the D̃ of the piece before it.
  real_P = jnp.concatenate([jnp.ones((B,), bool), bp])
  keep_P = top_P | ~real_P | (jnp.abs(d_P) >= jnp.asarray(fill_tol, jnp.float32))
  ptr = jnp.where(keep_P, jnp.arange(2 * B, dtype=jnp.int32), prev_P)
  ptr = jax.lax.fori_loop(0, max(int(2 * B - 1).bit_length(), 1),       # pointer jumping
                          lambda _, p: p[p], ptr)
  r_P = (jnp.asarray(local_weight, jnp.float32) * d_P[ptr]
         + jnp.asarray(global_weight, jnp.float32) * value_P)
  # Tokens: the k-th break point of row a at or before t gives the piece (k = 0: the first).
  mark = jnp.zeros((B, T), bool).at[jnp.where(bp, tree.parent, B),
                                    jnp.clip(tree.prefix, 0, T - 1)].set(True, mode="drop")
  k_BT = ops.prefix_sum(mark)
  rank = k_BT[jnp.clip(tree.parent, 0, B - 1), jnp.clip(tree.prefix, 0, T - 1)]  # of c's point
  table = jnp.zeros((B, B + 1), jnp.float32).at[:, 0].set(r_P[:B])
  table = table.at[jnp.where(bp, tree.parent, B), rank].set(r_P[B:], mode="drop")
  return jnp.take_along_axis(table, k_BT, axis=1)


def _paper_form(tree: TreeRows, num_groups: int, global_weight, local_weight,
                reweight: str) -> Array:
  total, count = tree_leaf_values(tree)
  value = total / jnp.maximum(count, 1.0)                       # V(a, t)
  mom = ops.group_moments(tree.reward, tree.group_id, num_groups, tree.valid)
  v_root = ops.gather_groups(mom.mean, tree.group_id)           # [B]
  ga = value - v_root[:, None]
  la = value - _parent_segment(tree, value, count, v_root)
  r_seg = (jnp.asarray(global_weight, jnp.float32) * ga
           + jnp.asarray(local_weight, jnp.float32) * la)
  return r_seg / _weight(jnp.maximum(count, 1.0), reweight)


@register_estimator(
    "treerl", needs=("reward", "group_id", "response_mask", "parent_id", "prefix_len"),
    paper=_PAPER, static_argnames=("num_groups", "reweight", "form"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: THUDM/TreeRL@f0edbea "
                            "openrlhf/trainer/ppo_utils/tree_node.py (build_into_tree_format, "
                            "leaf_normalize, leaf_backpropagate, normalize_all_steps, "
                            "compute_weighted_update), parallel_mcts.py (fill_in_paths), "
                            "experience_maker.py, scripts/treerl-qw14b.sh"))
def treerl_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                      parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int,
                      global_weight: ArrayLike = 1.0, local_weight: ArrayLike = 1.0,
                      reweight: Literal["sqrt", "uniform", "none"] = "sqrt",
                      form: Literal["code", "paper"] = "code",
                      fill_tol: ArrayLike = 1e-6) -> Array:
  """TreeRL process supervision: each tree segment's tokens get a credit built from the leaves under it.

  A segment s is a maximal run of a row's own tokens between the columns where branches
  depart from it; L(s) are the valid rows (leaves) whose path passes through s, n(s) their
  number, N the leaves of the prompt group and ω(n) = sqrt(n) ("sqrt"), n or 1. As the
  authors' code computes it (`form="code"`)::

    c_l  = r_l − (1/(N−1)) Σ_{k≠l} r_k                   (leave-one-out)
    V(s) = Σ_{l ∈ L(s)} c_l / (n(s) ω(n(s))),    V(root) = 0
    D(s) = V(s) − V(parent(s)),   D̃(s) = D(s), or D̃(parent(s)) where abs(D(s)) < τ
    R(s) = w_l D̃(s) + w_g V(s)

  used as the advantage of every token of s. On a flat batch R = 2N/(N−1)·(r − mean r).
  `form="paper"`: V(s) = mean_{L(s)} r, R(s) = (w_g (V(s) − V(root)) + w_l (V(s) −
  V(parent(s)))) / ω(n(s)).

  Paper: "TreeRL: LLM Reinforcement Learning with On-Policy Tree Search", ACL 2025,
  arXiv 2506.11902. Differences from the code: every valid row is a trained leaf (its
  `--use_all_terminals`), each token is a loss token once (the code trains each
  root-to-leaf path as its own sequence), τ = 1e-6 in float32 (the code tests 1e-8 in
  float64), and a lone leaf gives 0 (the code fails). Cost: O(B² + B·T).

  Args:
    reward: [B] float outcome reward of each row's complete path.
    group_id: [B] int prompt group in [0, num_groups).
    response_mask: [B,T] bool, the tokens each row sampled itself.
    parent_id: [B] int, the row a branch continues (−1: a root; less than the row index).
    prefix_len: [B] int, the column where a branch departs (0 for roots).
    num_groups: static number of prompt groups.
    global_weight: w_g (the state value V, or the paper's global term).
    local_weight: w_l (the filled difference D̃, or the paper's local term).
    reweight: static, "sqrt" | "uniform" | "none".
    form: static, "code" | "paper".
    fill_tol: τ of the code's fill-in (code form only; 0 turns it off).

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> mask = np.zeros((4, 5), bool); mask[:2, 1:] = True; mask[2:, 3:] = True
    >>> kw = dict(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
    ...     response_mask=mask, parent_id=np.array([-1, -1, 0, 0], np.int32),
    ...     prefix_len=np.array([0, 0, 3, 3], np.int32), num_groups=1)
    >>> np.round(np.asarray(treerl_advantages(**kw), np.float64)[0], 5).tolist()  # c = ±2/3
    [0.0, 0.2566, 0.2566, 1.20503, 1.20503]
    >>> np.round(np.asarray(treerl_advantages(**kw, form="paper"), np.float64)[0], 5).tolist()
    [0.0, 0.19245, 0.19245, 0.83333, 0.83333]
  """
  check_choice("treerl_advantages", "reweight", reweight, REWEIGHTS)
  check_choice("treerl_advantages", "form", form, FORMS)
  tree = tree_layout("treerl_advantages", reward, group_id, response_mask, parent_id, prefix_len,
                     num_groups)
  if form == "code":
    r_seg = _code_form(tree, global_weight, local_weight, reweight, fill_tol)
  else:
    r_seg = _paper_form(tree, num_groups, global_weight, local_weight, reweight)
  return jax.lax.stop_gradient(jnp.where(tree.mask & tree.valid[:, None], r_seg, 0.0))
