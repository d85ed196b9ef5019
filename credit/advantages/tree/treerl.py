"""TreeRL: process credit from an on-policy tree, from the value of each segment's leaves."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.tree._common import tree_leaf_values
from credit.registry import register_estimator
from credit.trees import TreeRows, segment_starts, tree_layout

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


def _path_view(tree: TreeRows, x_BTC: Array) -> Array:
  """[B,T,C]: x along each row's root-to-row path, x[owner of column t on the path, t].

  Column t of row a's path is owned by a for t >= prefix_len[a], else by the ancestor whose
  own tokens hold it; a while loop over the tree depth walks up the ancestors.
  """
  B, T = x_BTC.shape[:2]
  t_idx = jnp.arange(T, dtype=jnp.int32)[None, :]
  out = x_BTC

  def cond(state):
    return jnp.any(state[0] >= 0)

  def body(state):
    cur, hi, out = state
    on = cur >= 0
    safe = jnp.clip(cur, 0, B - 1)
    lo = tree.prefix[safe]
    take = on[:, None] & (t_idx >= lo[:, None]) & (t_idx < hi[:, None])
    out = jnp.where(take[:, :, None], x_BTC[safe], out)
    return jnp.where(on, tree.parent[safe], -1), jnp.where(on, lo, hi), out

  _, _, out = jax.lax.while_loop(cond, body, (tree.parent, tree.prefix, out))
  return out


def _weight(n: Array, reweight: str) -> Array:
  """ω(n) of `compute_weighted_update`: √n, n or 1 (n >= 1)."""
  if reweight == "sqrt":
    return jnp.sqrt(n)
  if reweight == "uniform":
    return n
  return jnp.ones_like(n)


def _code_form(tree: TreeRows, global_weight, local_weight, reweight: str, fill_tol) -> Array:
  B, T = tree.mask.shape
  # Leave-one-out centred leaf reward, from pairwise differences (exact 0 on equal rewards).
  same = ((tree.group_id[:, None] == tree.group_id[None, :])
          & tree.valid[:, None] & tree.valid[None, :])
  n_grp = jnp.sum(same, axis=1).astype(jnp.float32)                   # N of the row's group
  diff = jnp.sum(jnp.where(same, tree.reward[:, None] - tree.reward[None, :], 0.0), axis=1)
  c = jnp.where(tree.valid & (n_grp >= 2), diff / jnp.maximum(n_grp - 1.0, 1.0), 0.0)
  total, count = tree_leaf_values(tree._replace(reward=c))
  n = jnp.maximum(count, 1.0)
  value = total / (n * _weight(n, reweight))                          # V(a, t)
  n_root = jnp.maximum(n_grp, 1.0)
  v_root = jnp.sum(jnp.where(same, c[None, :], 0.0), axis=1) / (n_root * _weight(n_root, reweight))
  d = value - _parent_segment(tree, value, count, v_root)             # D(a, t)
  # Fill-in along each path: a |D| < tol segment below the top one takes its parent's D̃.
  has = count[jnp.arange(B), jnp.clip(tree.prefix, 0, T - 1)] > 0        # a valid leaf below
  mark, _ = segment_starts(tree, has, T)
  t_idx = jnp.arange(T, dtype=jnp.int32)[None, :]
  own_start = tree.child[:, None] & (t_idx == tree.prefix[:, None])
  bound = (mark | own_start).astype(jnp.float32)
  path = _path_view(tree, jnp.stack([d, bound], axis=-1))
  d_path, b_path = path[..., 0], path[..., 1] > 0
  top = ~jnp.cumsum(b_path, axis=1).astype(bool)                     # before the first cut
  keep = top | (jnp.abs(d_path) >= jnp.asarray(fill_tol, jnp.float32))
  last = jax.lax.cummax(jnp.where(keep, t_idx, 0), axis=1)
  filled = jnp.take_along_axis(d_path, last, axis=1)                  # D̃ on own columns
  return (jnp.asarray(local_weight, jnp.float32) * filled
          + jnp.asarray(global_weight, jnp.float32) * value)


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
    paper=_PAPER, static_argnames=("num_groups", "reweight", "form"))
def treerl_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                      parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int,
                      global_weight: ArrayLike = 1.0, local_weight: ArrayLike = 1.0,
                      reweight: Literal["sqrt", "uniform", "none"] = "sqrt",
                      form: Literal["code", "paper"] = "code",
                      fill_tol: ArrayLike = 1e-6) -> Array:
  """TreeRL process supervision: every token of a tree segment s gets the credit R(s) built
  from the leaves (complete rows) under s; by default as the authors' code computes it.

  Confidence: code-verified for `form="code"` (THUDM/TreeRL at f0edbea, read for this:
  `openrlhf/trainer/ppo_utils/tree_node.py` `build_into_tree_format`, `leaf_normalize`,
  `leaf_backpropagate`, `normalize_all_steps`, `select_terminal`, `selected_backpropagate`,
  `compute_weighted_update`; `parallel_mcts.py` `path_from_root_to_node`, `gather_paths`,
  `fill_in_paths`; `entropy_chain_local_manager.py` `evaluate_node`, `entropy_guided_chain`;
  `experience_maker.py` `_generate_vllm_mcts`, `sample_responses_bymcts`;
  `experience_maker_reinforce.py` `make_experience`; `models/utils.py`
  `compute_reward_naive`; `train_reinforce_ray.py` argument defaults; the EPTree run script
  `scripts/treerl-qw14b.sh`). `form="paper"` is paper-equation (TreeRL §3 as restated in a
  public reimplementation's docstring; the paper PDF was not read here).

  Paper: "TreeRL: LLM Reinforcement Learning with On-Policy Tree Search", arXiv 2506.11902.

  A segment s is a maximal run of a row's own tokens between the columns where branches
  depart from it (a node of `build_into_tree_format`'s tree). parent(s) is the previous
  segment of the same row, the parent row's segment that ends where the row departs (for a
  branch's first segment), or the group root (for a root row's first segment). L(s) is the
  set of valid rows (leaves) whose path passes through s, n(s) = |L(s)|; N is the number of
  valid rows of the prompt group (the leaves of all its trees) and ω(n) = √n ("sqrt"),
  n ("uniform") or 1 ("none", the code's "original").

  Code (`form="code"`, the EPTree script's flags `--use_pure_binary --process_supervision
  --use_state_value_reward --use_weighted_value --weighted_value_style sqrt`, and the
  defaults `overall_norm_style="none"`, `average_one_generation=False`,
  `advantage_mix_allancestor=False`, `use_orm_reward=use_chain_reward=False`):

  .. math::
    c_l   = r_l − (1/(N−1)) Σ_{k≠l} r_k                  (leaf_normalize: leave-one-out)
    V(s)  = Σ_{l∈L(s)} c_l / (n(s)·ω(n(s)))              (accumulated_value, divided by
                                                          ω(selected) then by n)
    V(root) = Σ_l c_l / (N·ω(N))   (= 0)
    D(s)  = V(s) − V(parent(s))                          (path "value")
    D̃(s) = D(s) if s is a root row's first segment or |D(s)| ≥ τ, else D̃(parent(s))
                                                          (fill_in_paths)
    R(s)  = w_l·D̃(s) + w_g·V(s)                          ("value" + "state_value")

  R(s) is the per-token reward of the path's tokens (`_generate_vllm_mcts`), used as the
  advantage as is (`compute_reward_naive` with `process_reward`, KL coefficient 0 in the
  script; `--normalize_reward_from_multi_traces_with_rloo` is only asserted, not applied, on
  this path, and `--normalize_advantage` is off). On a flat batch (one segment per row),
  R = 2·c_l = 2N/(N−1)·(r_l − mean_g r). `global_weight=0` gives the code's pure-advantage
  mode (neither flag), `local_weight=0` its `--use_value_only`.

  Paper (`form="paper"`): V(s) = mean_{L(s)} r, GA = V(s) − V(root) with V(root) the group
  mean, LA = V(s) − V(parent(s)), R(s) = (w_g·GA + w_l·LA)/ω(n(s)); on a flat batch
  2·(r − μ_g). The code differs: leave-one-out centring (factor N/(N−1)), the weight ω
  applied to each node value before the difference (so D(s) = V(s) − V(parent) mixes two
  weights), the global term V(s) − V(root) with V(root) = 0, and the fill-in of zero D.

  Deviations from the code, and why:
  * Leaves. The code centres and counts over all leaves of the prompt's trees but trains a
    random subset of `num_traces` of them (`select_terminal`, one correct leaf first), and ω
    counts the selected leaves only. Here every valid row is a leaf and is trained, which
    is the code with `--use_all_terminals` (sampling belongs to the rollout, not here).
  * Token multiplicity. The code trains each selected root-to-leaf path as its own sequence,
    so the tokens of s enter the loss n(s) times (each with R(s), under the per-sequence
    token mean of its policy loss). Here each token is a loss token once, in the row that
    sampled it (`credit.trees`); R(s) per token is the code's, its multiplicity is not.
  * Fill-in tolerance. The code tests |D| < 1e-8 in float64; in float32 a D that is zero in
    exact arithmetic comes out at ~1e-8..1e-7, so τ = `fill_tol` defaults to 1e-6
    (`fill_tol=0` turns the fill-in off).
  * Degenerate groups. A lone leaf makes the code fail (`assert False` in leaf_normalize);
    here its c is 0, so its group gets exact zeros. c is computed from pairwise
    differences, so a group of equal rewards gives exact zeros in float32 too.
  * Not reproduced: `--mask_repeated_samples` (a path that did not end in EOS gets −1 on
    every token; needs a truncation flag this contract does not carry), the reward model
    and `use_pure_RM` scores (the reward arrives in `reward`), `--correct_bonus_ratio` (off:
    threshold 0 in the script).
  * Ours: invalid rows (empty response, group id out of range) are neither leaves nor
    credited; a branch with no valid leaf under it makes no segment.

  Cost: [B,B] ancestry and pairwise centring, while loops over the tree depth, O(B² + B·T).

  Args:
    reward: [B] float outcome reward of each row's complete path (the code's binary score).
    group_id: [B] int prompt group in [0, num_groups).
    response_mask: [B,T] bool, the tokens each row sampled itself.
    parent_id: [B] int, the row a branch continues (−1: a root; < the row index).
    prefix_len: [B] int, the column where a branch departs (0 for roots).
    num_groups: static number of prompt groups.
    global_weight, local_weight: w_g (the state value V, or GA in the paper form) and w_l
      (the filled difference D̃, or LA).
    reweight: static, "sqrt" | "uniform" | "none" (the code's `weighted_value_style`).
    form: static, "code" (default) | "paper".
    fill_tol: τ of the code's fill-in (code form only).

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

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
