"""PROPA: per-node GRPO on log-boosted MCTS values (the authors' code), or a dense
step-value term on top of GRPO (ProRAG's form, an option).
"""
from __future__ import annotations

from typing import Any, Literal

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.tree._common import (check_steps, pooled_zscore, prorag_outcome,
                                           step_tokens, tree_leaf_values_at)
from credit.contract import ContractError, validate_fields
from credit.ops._cast import as_f32
from credit.registry import register_estimator
from credit.trees import (first_of_node, sibling_matrix, tree_layout,
                          validate_tree)

Array = jax.Array

__all__ = ["propa_advantages", "log_boost", "validate_propa_inputs"]

_PAPER = ("PROPA: Toward Process-level Optimization in Visual Reasoning via Reinforcement "
          "Learning, arXiv preprint; code github.com/YanbeiJiang/PROPA")
VALUE_TRANSFORMS = ("identity", "log_boost")
_STEP_FIELDS = ("step_value", "step_mask", "step_id")


def log_boost(q: ArrayLike, a: ArrayLike = 10.0) -> Array:
  """log(1 + a·q)/log(1 + a) on q clipped to [0, 1] (PROPA's label transform of Q)."""
  q = jnp.clip(as_f32(q), 0.0, 1.0)
  a = jnp.asarray(a, jnp.float32)
  return jnp.log1p(a * q) / jnp.log1p(a)


def _node_values_to_tokens(tree, first, own, as_parent) -> Array:
  """[B,T]: token (a, t) takes `as_parent` of the node of the last branch point of row a at or
  before t, `own[a]` before the first (`first`: one branch row per node).

  The row's own value plus, at each branch point, the step from the previous node's value,
  summed over the columns (one cumulative sum instead of a search and a gather).
  """
  B, T = tree.mask.shape
  writer = first & tree.child & (tree.prefix >= 0) & (tree.prefix < T)
  before = (writer[None, :] & (tree.parent[None, :] == tree.parent[:, None])
            & (tree.prefix[None, :] < tree.prefix[:, None]))
  prev = jnp.argmax(jnp.where(before, tree.prefix[None, :], -1), axis=1)
  prev_value = jnp.where(jnp.any(before, axis=1), as_parent[prev],
                         own[jnp.clip(tree.parent, 0, B - 1)])
  step = jnp.zeros((B, T), jnp.float32).at[
      jnp.where(writer, tree.parent, B), jnp.clip(tree.prefix, 0, T - 1)].add(
          as_parent - prev_value, mode="drop")
  return own[:, None] + ops.prefix_sum(step)


def _node_grpo(reward, group_id, response_mask, parent_id, prefix_len, num_groups, eps,
               min_span, boost_a) -> Array:
  """The code's form on the tree layout (see `propa_advantages`)."""
  tree = tree_layout("propa_advantages", reward, group_id, response_mask, parent_id, prefix_len,
                     num_groups)
  B, T = tree.mask.shape
  valid, child = tree.valid, tree.child
  rows = jnp.arange(B, dtype=jnp.int32)
  p = jnp.clip(tree.prefix, 0, T - 1)
  par = jnp.clip(tree.parent, 0, B - 1)
  # Mean leaf reward below (a, t), at (c, p_c) and (parent(c), p_c) only.
  total, count = tree_leaf_values_at(tree, jnp.concatenate([rows, par]), jnp.concatenate([p, p]))
  value_2B = total / jnp.maximum(count, 1.0)
  x = log_boost(value_2B[:B], boost_a)                # row c as a child of its node
  x_cont = log_boost(value_2B[B:], boost_a)           # the parent's continuation in c's node
  # Members of c's node: its valid siblings (roots: the valid roots of its prompt group) and,
  # for a branch node, the parent row's own continuation.
  same = ((tree.parent[:, None] == tree.parent[None, :])
          & (tree.prefix[:, None] == tree.prefix[None, :])
          & (tree.group_id[:, None] == tree.group_id[None, :]))
  memb = same & valid[None, :]
  cont = child & valid[par]
  mf, cf = memb.astype(jnp.float32), cont.astype(jnp.float32)
  n = jnp.sum(mf, axis=1) + cf
  mean = (mf @ x + cf * x_cont) / jnp.maximum(n, 1.0)
  dev = x[None, :] - mean[:, None]
  ss = jnp.sum(mf * dev * dev, axis=1) + cf * (x_cont - mean) ** 2
  std = ops.safe_sqrt(ss / jnp.maximum(n - 1.0, 1.0))  # unbiased (torch .std())
  hi = jnp.maximum(jnp.max(jnp.where(memb, x[None, :], -jnp.inf), axis=1),
                   jnp.where(cont, x_cont, -jnp.inf))
  lo = jnp.minimum(jnp.min(jnp.where(memb, x[None, :], jnp.inf), axis=1),
                   jnp.where(cont, x_cont, jnp.inf))
  all0 = (jnp.sum(mf * (x[None, :] != 0.0), axis=1) + cf * (x_cont != 0.0)) == 0
  all1 = (jnp.sum(mf * (x[None, :] != 1.0), axis=1) + cf * (x_cont != 1.0)) == 0
  skip = (n < 2) | all0 | all1 | (hi - lo < jnp.asarray(min_span, jnp.float32))
  denom = std + jnp.asarray(eps, jnp.float32)
  own = jnp.where(skip | ~valid, 0.0, (x - mean) / denom)
  as_parent = jnp.where(skip | ~cont, 0.0, (x_cont - mean) / denom)
  # Row a's tokens from a branch point p on are its continuation step in the node (a, p).
  first = first_of_node(sibling_matrix(tree), valid)
  out = _node_values_to_tokens(tree, first, own, as_parent)
  return jnp.where(tree.mask & valid[:, None], out, 0.0)


def _step_value_form(reward, step_value, step_mask, step_id, group_id, response_mask,
                     num_groups, group_size, beta, eps, var_eps, value_transform) -> Array:
  """The step-value option's form (see `propa_advantages`)."""
  if step_value is None or step_mask is None or step_id is None:
    raise ValueError("propa_advantages: step_value_form=True needs step_value, step_mask and "
                     "step_id")
  reward_B, gid_B, _, valid_B = ops.group_rows(
      "propa_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  mask_BT, step_BK, sid_BT, _ = step_tokens(response_mask, step_mask, step_id)
  q_BK = as_f32(step_value)
  chex.assert_equal_shape([q_BK, step_BK])
  q_BK = jnp.where(step_BK, q_BK, 0.0)
  if value_transform == "log_boost":
    q_BK = log_boost(q_BK)
  a_o, big_B = prorag_outcome(reward_B, gid_B, valid_B, num_groups, group_size, eps)
  cell_ok = step_BK & big_B[:, None]
  z_BK = pooled_zscore(q_BK, cell_ok, gid_B, num_groups, group_size, var_eps)
  adv = a_o[:, None] + jnp.asarray(beta, jnp.float32) * ops.turn_broadcast(z_BK, sid_BT)
  return jnp.where(mask_BT & big_B[:, None], adv, 0.0)


@register_estimator(
    "propa", needs=("reward", "group_id", "response_mask", "parent_id", "prefix_len"),
    paper=_PAPER, optional_needs={f: "step_value_form" for f in _STEP_FIELDS},
    static_argnames=("num_groups", "group_size", "value_transform", "step_value_form"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: YanbeiJiang/PROPA "
                            "{Math-Vision,Trance}/RL_PRM_*/create_GRPO_train_*.py "
                            "(process_json_file, log_boost), swift/plugin/orm.py (custom_grpo), "
                            "swift/trainers/rlhf_trainer/grpo_trainer.py (_prepare_batch_inputs)"))
def propa_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                     parent_id: ArrayLike | None = None, prefix_len: ArrayLike | None = None,
                     step_value: ArrayLike | None = None, step_mask: ArrayLike | None = None,
                     step_id: ArrayLike | None = None, num_groups: int,
                     group_size: int | None = None, min_span: ArrayLike = 0.1,
                     boost_a: ArrayLike = 10.0, eps: ArrayLike = 1e-4,
                     step_value_form: bool = False, beta: ArrayLike = 0.3,
                     var_eps: ArrayLike = 1e-8,
                     value_transform: Literal["identity", "log_boost"] = "identity") -> Array:
  """PROPA: GRPO within each MCTS node on log-boosted node values (the authors' code).

  After tree search, every node with children is a GRPO group of its children (the
  sibling next steps), each labelled with the log-boosted mean reward below it. On this
  library's tree layout a node is an exact-prefix group (`credit.trees`): the roots of a
  prompt group, or a branch point (a, p) with its branches and row a's own continuation.
  With x = log_boost(V), log_boost(v) = clip(log(1 + 10v) / log 11, 0, 1), over the node's
  valid members N::

    A_c = (x_c − mean_N x) / (std_N x + ε)            (unbiased std, ε = 1e-4)
    A_c = 0   if size(N) < 2, all x are 0, all are 1, or max_N x − min_N x < 0.1

  Token credit by segments as in `cbpo_advantages`; on a flat batch this is GRPO on
  log_boost(reward) per prompt group.

  `step_value_form=True` is ProRAG's form with MCTS step values Q (`step_value`,
  `step_mask`, `step_id`; the tree fields are then ignored):
  A[b,t] = (A_o[b] + β (Q[b,k(t)] − μ^Q_g) / σ^Q_g) · M[b,t], each valid step counted once.

  Paper: "PROPA: Toward Process-level Optimization in Visual Reasoning via Reinforcement
  Learning". Differences from the authors' code: a whole segment between two branch points
  takes the node's advantage (the layout has no step boundaries inside a segment), and
  values are the rows' mean rewards (the code's MCTS back-ups, equal when each rollout is
  backed up once). The step-value option is this library's. Cost: O(B² + B·T).

  Args:
    reward: [B] float outcome reward of each row's complete path.
    group_id: [B] int prompt group in [0, num_groups) (branches inherit their root's).
    response_mask: [B,T] bool, the tokens each row sampled itself.
    parent_id: [B] int, the row a branch continues (−1: a root; less than the row index).
    prefix_len: [B] int, the column where a branch departs (0 for roots).
    step_value: [B,K] MCTS value of each step (option only).
    step_mask: [B,K] bool (option only).
    step_id: [B,T] int step of each token, −1 outside (option only).
    num_groups: static number of prompt groups.
    group_size: static G (option only).
    min_span: the skip threshold on max − min of a node's boosted values.
    boost_a: the 10 of log_boost.
    eps: ε added to the std (both forms).
    step_value_form: static; True for the option.
    beta: β of the option.
    var_eps: the option's step-variance ε.
    value_transform: static Q transform of the option ("log_boost" or none).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> mask = np.zeros((4, 6), bool); mask[:2, 1:] = True; mask[2:, 3:] = True
    >>> a = propa_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
    ...     response_mask=mask, parent_id=np.array([-1, -1, 0, 0], np.int32),
    ...     prefix_len=np.array([0, 0, 3, 3], np.int32), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.0, 0.707, 0.707, 0.5773, 0.5773, 0.5773], [0.0, -0.707, -0.707, -0.707, -0.707, -0.707],
     [0.0, 0.0, 0.0, -1.1545, -1.1545, -1.1545], [0.0, 0.0, 0.0, 0.5773, 0.5773, 0.5773]]
  """
  check_choice("propa_advantages", "value_transform", value_transform, VALUE_TRANSFORMS)
  if step_value_form:
    return _step_value_form(reward, step_value, step_mask, step_id, group_id, response_mask,
                            num_groups, group_size, beta, eps, var_eps, value_transform)
  if parent_id is None or prefix_len is None:
    raise ValueError("propa_advantages: the default (node GRPO) form needs parent_id and "
                     "prefix_len (flat batch: parent_id = -1, prefix_len = 0)")
  return jax.lax.stop_gradient(_node_grpo(reward, group_id, response_mask, parent_id,
                                          prefix_len, num_groups, eps, min_span, boost_a))


def validate_propa_inputs(*, num_groups: int | None = None, step_value_form: bool = False,
                          **fields: Any) -> None:
  """Eager checks before tracing: contract shapes/dtypes, finite rewards, a non-empty
  `response_mask`; the tree layout (default form) or `step_id` < K and finite `step_value`
  where `step_mask` (`step_value_form=True`)."""
  validate_fields(fields, num_groups=num_groups, where="propa")
  if not step_value_form:
    validate_tree(fields["parent_id"], fields["prefix_len"], fields.get("group_id"),
                  num_tokens=np.shape(fields["response_mask"])[-1], where="propa")
    return
  check_steps("propa", fields)
  q = np.asarray(fields["step_value"])[np.asarray(fields["step_mask"]).astype(bool)]
  if not np.all(np.isfinite(q)):
    raise ContractError("propa: `step_value` contains NaN/inf values under `step_mask`")
