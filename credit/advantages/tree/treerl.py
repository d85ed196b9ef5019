"""TreeRL: process credit from an on-policy tree, global plus local advantage of each segment."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.tree.cbpo import TreeRows, tree_rows
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["treerl_advantages", "tree_leaf_values"]

_PAPER = ("TreeRL: LLM Reinforcement Learning with On-Policy Tree Search (Hou et al., ACL 2025), "
          "arXiv 2506.11902; code https://github.com/THUDM/TreeRL")

REWEIGHTS = ("sqrt", "uniform", "none")


def _exit_columns(tree: TreeRows, big: int) -> Array:
  """[B,B] int32 E[r, a]: the column where row r's root-to-row path leaves row a's tokens.

  `big` when a = r (the path ends in r), prefix_len of the branch through which the path
  leaves a when a is a proper ancestor of r, −1 when a is not on r's path.
  """
  B = tree.parent.shape[0]
  rows = jnp.arange(B, dtype=jnp.int32)
  exit0 = jnp.full((B, B), -1, jnp.int32).at[rows, rows].set(big)

  def cond(state):
    return jnp.any(state[0] >= 0)

  def body(state):
    cur, ex = state
    on = cur >= 0
    safe = jnp.clip(cur, 0, B - 1)
    nxt = jnp.where(on, tree.parent[safe], -1)
    up = nxt >= 0
    ex = ex.at[jnp.where(up, rows, B), jnp.clip(nxt, 0, B - 1)].set(
        tree.prefix[safe], mode="drop")
    return nxt, ex

  _, ex = jax.lax.while_loop(cond, body, (rows, exit0))
  return ex


def tree_leaf_values(tree: TreeRows) -> tuple[Array, Array]:
  """(sum_BT, count_BT): over the valid rows r whose path passes through token (a, t), the sum
  of their rewards and their number (every row is a leaf: a complete path with a reward).

  Row r passes through (a, t) iff t < E[r, a] (`_exit_columns`); both are built from a
  histogram of E per row a and a reverse cumulative sum over columns, O(B² + B·T).
  """
  B, T = tree.mask.shape
  ex = _exit_columns(tree, T)                       # [r, a]
  e = jnp.clip(ex, 0, T)                            # −1 → bin 0, counted for no column
  bins = (jnp.arange(B, dtype=jnp.int32)[None, :] * (T + 1) + e).reshape(-1)
  w = jnp.broadcast_to(tree.valid[:, None], (B, B)).astype(jnp.float32)
  n = B * (T + 1)

  def per_column(x):
    h = jax.ops.segment_sum(x.reshape(-1), bins, n).reshape(B, T + 1)
    return jax.lax.cumsum(h, axis=1, reverse=True)[:, 1:]   # Σ_{e > t}

  return per_column(w * tree.reward[:, None]), per_column(w)


@register_estimator(
    "treerl", needs=("reward", "group_id", "response_mask", "parent_id", "prefix_len"),
    paper=_PAPER, static_argnames=("num_groups", "reweight"))
def treerl_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                      parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int,
                      global_weight: ArrayLike = 1.0, local_weight: ArrayLike = 1.0,
                      reweight: Literal["sqrt", "uniform", "none"] = "sqrt") -> Array:
  """TreeRL process supervision: R(s) = (GA(s) + LA(s)) / √|L(s)| for every tree segment s.

  Confidence: paper-equation (TreeRL §3, as restated in a public reimplementation's
  docstring found by search; the paper PDF was not read here). The authors' code
  (THUDM/TreeRL `openrlhf/trainer/ppo_utils/tree_node.py`, `parallel_mcts.py`
  `gather_paths`) was read for the layout of segments; its defaults differ, see below.

  Paper: "TreeRL: LLM Reinforcement Learning with On-Policy Tree Search", arXiv 2506.11902.

  A segment s is a maximal run of a row's own tokens between the columns where branches
  depart from it (every node of the paper's entropy-guided tree, EPTree, is such a run). With
  L(s) the leaves (complete rows) whose path passes through s:

  .. math::
    V(s)  = (1/|L(s)|) Σ_{l ∈ L(s)} r_l
    GA(s) = V(s) − V(root),      V(root) = mean reward of all rows of the prompt group
    LA(s) = V(s) − V(parent(s))
    R(s)  = (w_g·GA(s) + w_l·LA(s)) / √|L(s)|

  parent(s) is the previous segment of the same row, the parent row's segment that ends
  where the row departs (for the first segment of a branch), or the root (for the first
  segment of a root row, where LA = GA). Every token of s gets R(s). On a flat batch each row
  is one segment with L = {itself}: R = 2·(r − μ_g) (w_g = w_l = 1).

  `reweight`: "sqrt" (the paper's 1/√|L(s)|, so early segments shared by many leaves do not
  dominate), "uniform" (1/|L(s)|) or "none" — the code's `weighted_value_style` options.

  Differences from the authors' code (not reproduced): the code's default `gather_paths`
  credits a segment with LA only (V(s) − V(parent)) on leaf rewards first centred by a
  leave-one-out mean over all leaves, and its options mix in the outcome reward or the state
  value; set `global_weight=0` for the LA-only form. Ours: invalid rows (empty response,
  group id out of range) are neither leaves nor credited.

  Cost: [B,B] ancestry (a while loop over the tree depth), O(B² + B·T).

  Args:
    reward: [B] float outcome reward of each row's complete path.
    group_id: [B] int prompt group in [0, num_groups).
    response_mask: [B,T] bool, the tokens each row sampled itself.
    parent_id: [B] int, the row a branch continues (−1: a root; < the row index).
    prefix_len: [B] int, the column where a branch departs (0 for roots).
    num_groups: static number of prompt groups.
    global_weight, local_weight: w_g, w_l.
    reweight: static, "sqrt" | "uniform" | "none".

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

  >>> import numpy as np
  >>> mask = np.zeros((4, 5), bool); mask[:2, 1:] = True; mask[2:, 3:] = True
  >>> a = treerl_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
  ...     response_mask=mask, parent_id=np.array([-1, -1, 0, 0], np.int32),
  ...     prefix_len=np.array([0, 0, 3, 3], np.int32), num_groups=1)
  >>> np.round(np.asarray(a, np.float64)[0], 5).tolist()     # V = 2/3 then 1; V(root) = 1/2
  [0.0, 0.19245, 0.19245, 0.83333, 0.83333]
  """
  check_choice("treerl_advantages", "reweight", reweight, REWEIGHTS)
  tree = tree_rows("treerl_advantages", reward, group_id, response_mask, parent_id, prefix_len,
                   num_groups)
  B, T = tree.mask.shape
  total, count = tree_leaf_values(tree)
  value = total / jnp.maximum(count, 1.0)                       # V(a, t)
  mom = ops.group_moments(tree.reward, tree.group_id, num_groups, tree.valid)
  v_root = ops.gather_groups(mom.mean, tree.group_id)           # [B]
  # Segment starts: the columns where the leaf set of row a shrinks (a branch departs).
  t_idx = jnp.arange(T, dtype=jnp.int32)[None, :]
  change = jnp.concatenate([jnp.zeros((B, 1), bool), count[:, 1:] != count[:, :-1]], axis=1)
  start = jax.lax.cummax(jnp.where(change, t_idx, -1), axis=1)
  before = jnp.take_along_axis(value, jnp.clip(start - 1, 0, T - 1), axis=1)
  par = jnp.clip(tree.parent, 0, B - 1)
  entry = jnp.where(tree.child, value[par, jnp.clip(tree.prefix - 1, 0, T - 1)], v_root)
  v_parent = jnp.where(start >= 1, before, entry[:, None])
  ga = value - v_root[:, None]
  la = value - v_parent
  r_seg = (jnp.asarray(global_weight, jnp.float32) * ga
           + jnp.asarray(local_weight, jnp.float32) * la)
  n = jnp.maximum(count, 1.0)
  if reweight == "sqrt":
    r_seg = r_seg / jnp.sqrt(n)
  elif reweight == "uniform":
    r_seg = r_seg / n
  return jax.lax.stop_gradient(jnp.where(tree.mask & tree.valid[:, None], r_seg, 0.0))
