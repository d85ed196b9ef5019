"""CBPO: contrastive branch value on exact-prefix groups; also the tree-layout helpers of this
package (`validate_tree`, `tree_rows`, `sibling_matrix`, `segment_starts`).

Tree layout (`credit.trees`): B rows, each a complete sequence. A root has parent_id = −1 and
prefix_len = 0; a branch row c continues row parent_id[c] < c from column p = prefix_len[c]
(tokens[c, :p] are copied) and its `response_mask` covers only the tokens it sampled itself, so
every tree token is a loss token in exactly one row. The exact-prefix group ("node") of a branch
point (a, p) is {a} ∪ {c : parent_id[c] = a, prefix_len[c] = p}. The helpers compare rows
pairwise ([B,B] matrices: O(B²) memory and work, fine for a few hundred rows).
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.ops._cast import as_f32
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["cbpo_advantages", "validate_tree"]

_PAPER = ("Contrastive Branch Policy Optimization (CBPO); arXiv id not given in the seeds "
          "(abstract only)")


# --------------------------------------------------------------------------------------------
# Tree-layout helpers shared by the tree estimators of this package (cbpo, slate, treerl).
# --------------------------------------------------------------------------------------------


def _concrete(*xs) -> bool:
  return all(not isinstance(x, jax.core.Tracer) for x in xs if x is not None)


def validate_tree(parent_id: ArrayLike, prefix_len: ArrayLike, group_id: ArrayLike | None = None,
                  *, num_tokens: int | None = None, where: str = "tree") -> None:
  """Eager checks of a tree layout (host arrays; call before tracing).

  Raises ValueError when: the arrays are not [B] integers; a parent index is outside [−1, B)
  or not smaller than the row's own index; a branch departs at a column outside
  [1, num_tokens) or not after its parent's own departure column (a branch of a branch departs
  inside the parent's own tokens); a root has a non-zero prefix_len; a branch has another
  prompt group than its parent.
  """
  par = np.asarray(parent_id)
  pre = np.asarray(prefix_len)
  if par.ndim != 1 or pre.shape != par.shape:
    raise ValueError(f"{where}: parent_id and prefix_len must both be [B], got {par.shape} and "
                     f"{pre.shape}")
  if par.dtype.kind not in "iu" or pre.dtype.kind not in "iu":
    raise ValueError(f"{where}: parent_id and prefix_len must be integers, got {par.dtype} and "
                     f"{pre.dtype}")
  rows = np.arange(par.shape[0])
  bad = (par < -1) | (par >= rows)
  if bad.any():
    i = int(np.flatnonzero(bad)[0])
    raise ValueError(f"{where}: parent_id[{i}] = {par[i]}; a branch continues an earlier row "
                     "(−1 <= parent_id[c] < c)")
  root = par < 0
  if np.any(pre[root] != 0):
    i = int(np.flatnonzero(root & (pre != 0))[0])
    raise ValueError(f"{where}: root row {i} has prefix_len {pre[i]} (roots depart at 0)")
  child = ~root
  hi = np.iinfo(np.int64).max if num_tokens is None else num_tokens
  p = pre[child]
  if np.any((p < 1) | (p >= hi)):
    i = int(np.flatnonzero(child & ((pre < 1) | (pre >= hi)))[0])
    raise ValueError(f"{where}: branch row {i} departs at prefix_len {pre[i]}, outside "
                     f"[1, {num_tokens if num_tokens is not None else 'T'})")
  parents = np.where(child, par, 0)
  later = child & (pre <= pre[parents]) & (par[parents] >= 0)
  if later.any():
    i = int(np.flatnonzero(later)[0])
    raise ValueError(f"{where}: branch row {i} departs at {pre[i]}, not after its parent row "
                     f"{par[i]}'s own departure at {pre[par[i]]}")
  if group_id is not None:
    gid = np.asarray(group_id)
    if gid.shape != par.shape:
      raise ValueError(f"{where}: group_id must be [B] like parent_id, got {gid.shape}")
    diff = child & (gid != gid[parents])
    if diff.any():
      i = int(np.flatnonzero(diff)[0])
      raise ValueError(f"{where}: branch row {i} is in group {gid[i]} but its parent row "
                       f"{par[i]} in group {gid[par[i]]}")


class TreeRows(NamedTuple):
  """A tree batch after the shared checks (`tree_rows`).

  reward: [B] float32, 0 on invalid rows. group_id: [B] int32. mask: [B,T] bool.
  valid: [B] bool, a non-empty response and a group id in [0, num_groups).
  parent: [B] int32, −1 for roots. prefix: [B] int32. child: [B] bool (parent >= 0).
  """
  reward: Array
  group_id: Array
  mask: Array
  valid: Array
  parent: Array
  prefix: Array
  child: Array


def tree_rows(fn: str, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
              parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int) -> TreeRows:
  """Shape/type asserts, static checks, eager `validate_tree` (on concrete inputs) and the
  per-row validity of a tree batch."""
  check_int(fn, "num_groups", num_groups)
  if _concrete(parent_id, prefix_len, group_id, response_mask):
    validate_tree(parent_id, prefix_len, group_id, num_tokens=np.shape(response_mask)[-1],
                  where=fn)
  rows = ops.group_rows(fn, reward, group_id, num_groups, response_mask=response_mask)
  par = jnp.asarray(parent_id)
  pre = jnp.asarray(prefix_len)
  chex.assert_type([par, pre], int)
  chex.assert_equal_shape([par, pre, rows.values])
  par = par.astype(jnp.int32)
  return TreeRows(reward=jnp.where(rows.valid, rows.values, 0.0), group_id=rows.group_id,
                  mask=rows.mask, valid=rows.valid, parent=par,
                  prefix=pre.astype(jnp.int32), child=par >= 0)


def sibling_matrix(tree: TreeRows) -> Array:
  """[B,B] bool: rows c, c' are branches of the same node (same parent and prefix_len);
  True on the diagonal of branch rows, False for roots."""
  same = (tree.parent[:, None] == tree.parent[None, :]) & (
      tree.prefix[:, None] == tree.prefix[None, :])
  return same & tree.child[:, None] & tree.child[None, :]


def first_of_node(sib_BB: Array, valid_B: Array) -> Array:
  """[B] bool: the valid branch row of lowest index in its node (one writer per node)."""
  B = valid_B.shape[0]
  before = jnp.arange(B)[None, :] < jnp.arange(B)[:, None]
  return valid_B & ~jnp.any(sib_BB & valid_B[None, :] & before, axis=1)


def segment_starts(tree: TreeRows, has_B: Array, num_tokens: int) -> tuple[Array, Array]:
  """Branch points taken from each row and, per token, the last one at or before it.

  Args:
    tree: the batch.
    has_B: [B] bool, the branch rows whose node counts (e.g. the valid ones).
    num_tokens: T.

  Returns:
    (mark_BT, start_BT): mark[a, p] = a valid-looking branch departs from row a at column p;
    start[a, t] = the largest such p <= t, −1 before the first (the row's own segment).
  """
  B, T = tree.parent.shape[0], num_tokens
  ok = has_B & tree.child & (tree.prefix >= 0) & (tree.prefix < T)
  a = jnp.where(ok, tree.parent, B)               # out of range: dropped
  mark = jnp.zeros((B, T), bool).at[a, jnp.clip(tree.prefix, 0, T - 1)].set(True, mode="drop")
  pos = jnp.where(mark, jnp.arange(T, dtype=jnp.int32)[None, :], -1)
  return mark, jax.lax.cummax(pos, axis=1)


# --------------------------------------------------------------------------------------------


@register_estimator(
    "cbpo", needs=("reward", "group_id", "response_mask", "parent_id", "prefix_len"),
    paper=_PAPER, static_argnames=("num_groups",))
def cbpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int,
                    kappa: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """CBPO: GRPO on the roots, CBV-scaled centred rewards on each exact-prefix node, credited by
  non-overlapping segments.

  Confidence: inferred (from the abstract; spec `shared/methods/distill_and_structure.md` B2,
  whose every choice below is marked "(choice)" there). No code or equations of the paper were
  available to the spec's authors or here.

  Paper: "Contrastive Branch Policy Optimization" (CBPO; arXiv id not given in the seeds).

  .. math::
    roots:      A_b = (r_b − μ_g) / (σ_g + ε)        (GRPO over the prompt group's ROOT rows,
                                                      unbiased σ, ε = 1e-6; a lone root → 0)
    node N = {a} ∪ {c : parent(c) = a, prefix(c) = p}:
                a_b = r_b − mean_N r,   CBV_N = std_N r (population),
                A_b^N = a_b · (1 + κ · CBV_N)

  A branch row's own advantage is A_c^{N(c)} (as a member of its node). Token credit by
  non-overlapping segments: with p_1 < … < p_n the columns where branches depart from row b,
  b's own tokens before p_1 get b's own advantage (root GRPO or branch value), its tokens in
  [p_i, p_{i+1}) get A_b^{N_i}, b's advantage as the parent member of node i. The copied prefix
  of a branch is not its loss token (`response_mask`), so no token is credited twice. CBV
  only rescales (sign kept); a node without spread has scale 1. On a flat batch (no branches)
  this is GRPO exactly.

  Choices (spec): a_b mean-centred without σ (CBV carries the scale); CBV with ddof = 0
  (∈ [0, 0.5] for 0/1 rewards); κ = 1. Ours: invalid rows (empty response, group id out of
  range) take part in no statistic (a node whose branches are all invalid is no node, and
  the parent's tokens keep its own advantage); a node's statistics use its valid members. The
  sampler side (entropy screening, path/node decays) is `credit.trees.grow_tree`.

  Cost: [B,B] sibling comparisons, O(B²).

  Args:
    reward: [B] float outcome reward of each row's complete path.
    group_id: [B] int prompt group in [0, num_groups) (branches inherit their root's).
    response_mask: [B,T] bool, the tokens each row sampled itself.
    parent_id: [B] int, the row a branch continues (−1: a root; must be < the row index).
    prefix_len: [B] int, the column where a branch departs (0 for roots).
    num_groups: static number of prompt groups.
    kappa: κ, weight of the contrastive branch value.
    eps: ε added to the root GRPO std.

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

  >>> import numpy as np
  >>> mask = np.zeros((7, 6), bool); mask[:4, 1:] = True; mask[4:, 3:] = True
  >>> a = cbpo_advantages(reward=np.array([1., 0, 0, 0, 1, 1, 0]),
  ...     group_id=np.zeros(7, np.int32), response_mask=mask,
  ...     parent_id=np.array([-1, -1, -1, -1, 1, 1, 1], np.int32),
  ...     prefix_len=np.array([0, 0, 0, 0, 3, 3, 3], np.int32), num_groups=1)
  >>> np.round(np.asarray(a, np.float64)[[1, 4, 6]], 5).tolist()
  [[0.0, -0.5, -0.5, -0.75, -0.75, -0.75], [0.0, 0.0, 0.0, 0.75, 0.75, 0.75],
   [0.0, 0.0, 0.0, -0.75, -0.75, -0.75]]
  """
  tree = tree_rows("cbpo_advantages", reward, group_id, response_mask, parent_id, prefix_len,
                   num_groups)
  B, T = tree.mask.shape
  r, valid = tree.reward, tree.valid
  kappa = jnp.asarray(kappa, jnp.float32)
  root_adv = ops.group_normalize(r, tree.group_id, num_groups, valid=valid & ~tree.child,
                                 eps=eps)
  # Node statistics seen from each branch row c: its valid siblings plus its parent.
  sib = sibling_matrix(tree) & valid[None, :]
  par = jnp.clip(tree.parent, 0, B - 1)
  par_in = (tree.child & valid[par]).astype(jnp.float32)
  sibf = sib.astype(jnp.float32)
  r_par = r[par]
  count = jnp.sum(sibf, axis=1) + par_in
  mean = (sibf @ r + par_in * r_par) / jnp.maximum(count, 1.0)
  dev = r[None, :] - mean[:, None]
  var = (jnp.sum(sibf * dev * dev, axis=1) + par_in * (r_par - mean) ** 2) / jnp.maximum(
      count, 1.0)
  scale = 1.0 + kappa * ops.safe_sqrt(var)
  own = jnp.where(tree.child, (r - mean) * scale, root_adv)
  as_parent = (r_par - mean) * scale          # the parent's advantage in c's node
  # Segments: row a's tokens from branch point p on take a's advantage in the node at p.
  first = first_of_node(sibling_matrix(tree), valid)
  _, start = segment_starts(tree, first, T)
  a_idx = jnp.where(first & tree.child, tree.parent, B)
  table = jnp.zeros((B, T), jnp.float32).at[a_idx, jnp.clip(tree.prefix, 0, T - 1)].set(
      as_parent, mode="drop")
  seg = jnp.take_along_axis(table, jnp.clip(start, 0, T - 1), axis=1)
  out = jnp.where(start >= 0, seg, own[:, None])
  return jax.lax.stop_gradient(jnp.where(tree.mask & valid[:, None], out, 0.0))
