"""CBPO: contrastive branch value on exact-prefix groups.

Tree layout (`credit.trees`): B rows, each a complete sequence. A root has parent_id = −1 and
prefix_len = 0; a branch row c continues row parent_id[c] < c from column p = prefix_len[c]
(tokens[c, :p] are copied) and its `response_mask` covers only the tokens it sampled itself, so
every tree token is a loss token in exactly one row. The exact-prefix group ("node") of a branch
point (a, p) is {a} ∪ {c : parent_id[c] = a, prefix_len[c] = p}. The layout helpers used here
(`validate_tree`, `tree_layout`, `sibling_matrix`, `first_of_node`, `segment_starts`) are in
`credit.trees`; they compare rows pairwise ([B,B] matrices: O(B²) memory and work, fine for a
few hundred rows).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator
from credit.trees import first_of_node, segment_starts, sibling_matrix, tree_layout
from credit.trees import TreeRows, validate_tree  # noqa: F401  (importable from here, as before)

Array = jax.Array

__all__ = ["cbpo_advantages", "validate_tree"]

_PAPER = "Contrastive Branch Policy Optimization (CBPO), arXiv preprint"


# The former name of `credit.trees.tree_layout`, kept importable from here.
tree_rows = tree_layout


@register_estimator(
    "cbpo", needs=("reward", "group_id", "response_mask", "parent_id", "prefix_len"),
    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def cbpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int,
                    kappa: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """CBPO: GRPO on the roots, contrast-scaled centred rewards on each exact-prefix node.

  Siblings that share an exact prefix differ only after their branch point, so their reward
  differences credit what follows it; a node whose branches disagree more (a larger
  contrastive branch value, CBV) gets larger advantages::

    roots:  A_b = (r_b − μ_g) / (σ_g + ε)           (GRPO over the prompt group's roots)
    node N = {a} ∪ {c : parent(c) = a, prefix(c) = p}:
            A_b^N = (r_b − mean_N r) · (1 + κ · CBV_N),    CBV_N = std_N r (population)

  Token credit by segments: a row's tokens before its first branch point get its own
  advantage (root GRPO, or its value as a member of its node); its tokens between branch
  points p_i and p_{i+1} get its advantage as the parent member of node i. The copied
  prefix of a branch is not its loss token, so no token is credited twice. On a flat batch
  this is GRPO exactly. Cost: [B,B] sibling comparisons.

  Paper: "Contrastive Branch Policy Optimization" (CBPO, arXiv preprint). The abstract
  gives the idea but no equation: the centring without σ, CBV with ddof 0, κ = 1 and the
  segment credit are this library's reading.

  Args:
    reward: [B] float outcome reward of each row's complete path.
    group_id: [B] int prompt group in [0, num_groups) (branches inherit their root's).
    response_mask: [B,T] bool, the tokens each row sampled itself.
    parent_id: [B] int, the row a branch continues (−1: a root; less than the row index).
    prefix_len: [B] int, the column where a branch departs (0 for roots).
    num_groups: static number of prompt groups.
    kappa: κ, weight of the contrastive branch value.
    eps: ε added to the root GRPO std.

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

  Example:
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
  tree = tree_layout("cbpo_advantages", reward, group_id, response_mask, parent_id, prefix_len,
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
