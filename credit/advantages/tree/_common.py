"""Pieces shared by several tree estimators (not methods themselves).

ProRAG's outcome and pooled step z-score, which PROPA's step-value form reuses
(`prorag_outcome`, `pooled_zscore`), the tokens of the valid steps of a step layout
(`step_tokens`) and its eager check (`check_steps`), and the leaf rewards below every token
of a tree (`tree_leaf_values`: TreeRL's node values, also PROPA's). The tree layout itself
(`tree_layout`, `sibling_matrix`, ...) is in `credit.trees`.
"""
from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit.contract import ContractError
from credit.ops._cast import as_f32
from credit.trees import TreeRows

Array = jax.Array


# --------------------------------------------------------------------------------------------
# Outcome and step statistics (ProRAG, PROPA).
# --------------------------------------------------------------------------------------------


def prorag_outcome(reward_B: Array, gid_B: Array, valid_B: Array, num_groups: int,
                   group_size: int | None, eps: ArrayLike) -> tuple[Array, Array]:
  """(A_o [B], row is in a group of >= 2 valid rows [B] bool).

  A_o = (r − μ_g)/(σ_g + eps), σ_g the unbiased (torch `.std()`) group std; rows of smaller
  groups (where the code's torch std is NaN) get 0.
  """
  count_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  a_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, eps=eps,
                            singleton="zero", group_size=group_size)
  big_B = valid_B & (count_B >= 2)
  return jnp.where(big_B, a_B, 0.0), big_B


def pooled_zscore(x_BN: Array, ok_BN: Array, gid_B: Array, num_groups: int,
                  group_size: int | None, var_eps: ArrayLike = 1e-8) -> Array:
  """Z-score of items [B,N] pooled over all valid items of each group's rows.

  .. math::
    μ = Σ_{g,ok} x / n,   σ = sqrt(Σ_{g,ok} (x − μ)² / n + var_eps)   (σ = 1 if n ≤ 1)

  (population variance, `var_eps` inside the root: ProRAG's `trainer.py`). Items are
  tokens (ProRAG, token-weighted) or steps (PROPA, step-weighted). Returns [B,N] float32,
  0 at invalid items. Rows whose group id is out of range must have no valid item.
  """
  ok = ok_BN.astype(bool)
  row_ok_B = jnp.any(ok, axis=1)
  x = jnp.where(ok, as_f32(x_BN), 0.0)
  okf = ok.astype(jnp.float32)
  gsum = lambda v_B: ops.group_reduce_rows(v_B, gid_B, row_ok_B, num_groups, group_size, "sum")
  n_B = gsum(jnp.sum(okf, axis=1))
  # Shift by a per-group pivot (the group max) so large scores keep their differences.
  pivot_B = ops.group_reduce_rows(jnp.max(jnp.where(ok, x, -jnp.inf), axis=1), gid_B, row_ok_B,
                                  num_groups, group_size, "max")
  pivot_B = jnp.where(row_ok_B, pivot_B, 0.0)
  d = jnp.where(ok, x - pivot_B[:, None], 0.0)
  dmean_B = gsum(jnp.sum(d, axis=1)) / jnp.maximum(n_B, 1.0)
  c = jnp.where(ok, d - dmean_B[:, None], 0.0)
  var_B = gsum(jnp.sum(c * c, axis=1)) / jnp.maximum(n_B, 1.0)
  std_B = jnp.where(n_B <= 1.0, 1.0, ops.safe_sqrt(var_B + jnp.asarray(var_eps, jnp.float32)))
  return jnp.where(ok, c / std_B[:, None], 0.0)


def step_tokens(response_mask, step_mask, step_id) -> tuple[Array, Array, Array, Array]:
  """(mask_BT, step_BK, sid_BT, tok_ok_BT): tokens of a valid step under the mask."""
  mask_BT = jnp.asarray(response_mask)
  step_BK = jnp.asarray(step_mask)
  sid_BT = jnp.asarray(step_id)
  chex.assert_rank([mask_BT, step_BK, sid_BT], 2)
  chex.assert_type(sid_BT, int)
  chex.assert_equal_shape([mask_BT, sid_BT])
  chex.assert_equal_shape_prefix([mask_BT, step_BK], 1)
  mask_BT, step_BK, sid_BT = mask_BT.astype(bool), step_BK.astype(bool), sid_BT.astype(jnp.int32)
  K = step_BK.shape[1]
  in_range = (sid_BT >= 0) & (sid_BT < K)
  step_of_tok = jnp.take_along_axis(step_BK, jnp.clip(sid_BT, 0, K - 1), axis=1)
  return mask_BT, step_BK, sid_BT, mask_BT & in_range & step_of_tok


def check_steps(where: str, fields: dict[str, Any]) -> None:
  """Eager checks shared by the step estimators: `step_id` < K on valid tokens."""
  sid = np.asarray(fields["step_id"])
  mask = np.asarray(fields["response_mask"]).astype(bool)
  K = np.asarray(fields["step_mask"]).shape[1]
  bad = mask & (sid >= K)
  if bad.any():
    raise ContractError(f"{where}: `step_id` must be < K={K} (the width of `step_mask`) on "
                        f"response tokens; {int(bad.sum())} token(s) are not")


# --------------------------------------------------------------------------------------------
# Leaf values of a tree (TreeRL, PROPA).
# --------------------------------------------------------------------------------------------


def exit_columns(tree: TreeRows, big: int) -> Array:
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


def subtree_sums(tree: TreeRows) -> Array:
  """[B,2]: over the valid rows r in the subtree of each row c (c and the rows below it), the
  sum of their rewards and their number (a [B,B] product with the `exit_columns` paths)."""
  ex = exit_columns(tree, tree.mask.shape[1])       # [r, c]: c is on r's path iff >= 0
  return jnp.matmul((ex >= 0).astype(jnp.float32).T, _own_sums(tree),
                    precision=jax.lax.Precision.HIGHEST)


def _own_sums(tree: TreeRows) -> Array:
  """[B,2]: (reward, 1) of each valid row, 0 for the others."""
  w_B = tree.valid.astype(jnp.float32)
  return jnp.stack([w_B * tree.reward, w_B], axis=-1)


def tree_leaf_values(tree: TreeRows) -> tuple[Array, Array]:
  """(sum_BT, count_BT): over the valid rows r whose path passes through token (a, t), the sum
  of their rewards and their number (every row is a leaf: a complete path with a reward).

  Row r passes through (a, t) iff t < E[r, a] (`exit_columns`): row a itself at every
  column, and the rows below a branch c of a (the subtree of c, whose paths leave a at
  p = prefix_len[c]) at the columns t < p. So with S_c the subtree sums (`subtree_sums`),
  sum[a, t] = r_a + Σ_{c: parent(c) = a, prefix_len(c) > t} S_c: a table of B entries and one
  reverse cumulative sum over columns, O(B² + B·T).
  """
  B, T = tree.mask.shape
  sub_B2 = subtree_sums(tree)
  # Branch c adds S_c to its parent's columns t < p, i.e. at column p − 1 of a suffix sum.
  col = tree.prefix - 1
  ok = tree.child & (col >= 0) & (col < T - 1)
  at = jnp.zeros((2, B, T), jnp.float32).at[:, jnp.where(ok, tree.parent, B),
                                            jnp.clip(col, 0, T - 1)].add(sub_B2.T, mode="drop")
  out = ops.prefix_sum(at, reverse=True) + _own_sums(tree).T[:, :, None]
  return out[0], out[1]


def tree_leaf_values_at(tree: TreeRows, row_Q: Array, col_Q: Array,
                        sub_B2: Array | None = None) -> tuple[Array, Array]:
  """`tree_leaf_values` at Q tokens (row_Q[q], col_Q[q]) only: ([Q] sum, [Q] count).

  The same sums, r_a + Σ_{c: parent(c) = a, prefix_len(c) > t} S_c, as a [Q,B] masked
  product instead of a [B,T] table (row indices must lie in [0, B)). `sub_B2`: the
  `subtree_sums` of the tree when already computed.
  """
  T = tree.mask.shape[1]
  sub_B2 = subtree_sums(tree) if sub_B2 is None else sub_B2
  branch_QB = (tree.child[None, :] & (tree.parent[None, :] == row_Q[:, None])
               & (tree.prefix[None, :] > col_Q[:, None]) & (tree.prefix[None, :] < T))
  out_Q2 = _own_sums(tree)[row_Q] + jnp.matmul(branch_QB.astype(jnp.float32), sub_B2,
                                               precision=jax.lax.Precision.HIGHEST)
  return out_Q2[:, 0], out_Q2[:, 1]
