"""SLATE: truncated step-level sampling; judge step rewards normalised among the k candidates
that share one prefix, plus the continuation choice and the judge-reward helpers."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.ops._cast import as_f32
from credit.registry import register_estimator
from credit.trees import tree_layout

Array = jax.Array

__all__ = ["slate_advantages", "slate_pick", "slate_answer_bonus", "slate_step_reward",
           "slate_node_ids"]

_PAPER = ("Truncated Step-Level Sampling with Process Rewards for Retrieval-Augmented "
          "Reasoning (SLATE), arXiv preprint; code https://github.com/algoprog/SLATE")


def slate_node_ids(parent_id: ArrayLike, prefix_len: ArrayLike, group_id: ArrayLike) -> Array:
  """[B] int32 id of each row's candidate set: a branch row gets the lowest row index of its
  siblings (same parent and prefix_len); a root gets B + its group id (the first step's
  candidates share the prompt), −1 for a negative group id. O(B²)."""
  par = jnp.asarray(parent_id, jnp.int32)
  pre = jnp.asarray(prefix_len, jnp.int32)
  gid = jnp.asarray(group_id, jnp.int32)
  child = par >= 0
  sib = (par[:, None] == par[None, :]) & (pre[:, None] == pre[None, :]) & child[:, None] & \
      child[None, :]
  rep = jnp.argmax(sib, axis=1).astype(jnp.int32)            # first sibling (itself if alone)
  B = par.shape[0]
  return jnp.where(child, rep, jnp.where(gid >= 0, B + gid, -1)).astype(jnp.int32)


@register_estimator(
    "slate", needs=("reward", "group_id", "response_mask", "parent_id", "prefix_len"),
    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="code-verified",
                    source=(_PAPER + "; code: algoprog/SLATE slate/training/step_level_algos.py "
                            "(compute_step_level_advantage, reward_weighted_sampling), "
                            "slate/rewards/llm_judge.py, configs/slate.yaml"))
def slate_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                     parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int,
                     eps: float = 1e-6) -> Array:
  """SLATE step advantage: each candidate's step reward z-scored among its k siblings.

  At every step k candidate next steps are sampled from the same prefix and judged; each
  candidate's reward r_j (`slate_step_reward`) is normalised among the candidates that
  share its prefix::

    A_j = (r_j − mean_node r) / (std_node(r, ddof=1) + 1e-6),    broadcast to j's tokens

  Rows are laid out as `credit.trees.step_rollout` does: k candidates with the same
  (parent_id, prefix_len), each owning only its step's tokens; first-step candidates are
  roots normalised among the valid roots of their prompt group. The continuation is drawn
  by `slate_pick` (softmax(A/η), η = 0.7). The step objective is the policy loss
  `slate_step`.

  Paper: "Truncated Step-Level Sampling with Process Rewards for Retrieval-Augmented
  Reasoning" (SLATE). Differences from the authors' code: a node with one valid candidate
  gives 0 (NaN in the code); invalid rows take part in no node. All-equal rewards give 0;
  flat batches are GRPO.

  Args:
    reward: [B] float step reward of each candidate row.
    group_id: [B] int prompt group in [0, num_groups).
    response_mask: [B,T] bool, the candidate step's own tokens.
    parent_id: [B] int, the row the candidate continues (−1 at the first step).
    prefix_len: [B] int, the column where the candidate starts (0 for roots).
    num_groups: static number of prompt groups.
    eps: added to the std.

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = slate_advantages(reward=np.array([2., 1, 0, -1, 2]), group_id=np.zeros(5, np.int32),
    ...     response_mask=np.ones((5, 1), bool), parent_id=np.full(5, -1, np.int32),
    ...     prefix_len=np.zeros(5, np.int32), num_groups=1)
    >>> np.round(np.asarray(a, np.float64)[:, 0], 6).tolist()
    [0.920357, 0.153393, -0.613572, -1.380536, 0.920357]
  """
  tree = tree_layout("slate_advantages", reward, group_id, response_mask, parent_id, prefix_len,
                     num_groups)
  B = tree.parent.shape[0]
  node = slate_node_ids(tree.parent, tree.prefix, tree.group_id)
  adv = ops.group_normalize(tree.reward, node, B + num_groups, valid=tree.valid, eps=eps)
  return jax.lax.stop_gradient(jnp.where(tree.mask & tree.valid[:, None], adv[:, None], 0.0))


def slate_pick(key: Array, advantages_B: ArrayLike, node_ids: ArrayLike, eta: ArrayLike = 0.7,
               valid: ArrayLike | None = None) -> Array:
  """SLATE's continuation choice: one candidate per node drawn from softmax(A/η).

  Gumbel-max within each node (the same distribution as the code's
  `torch.multinomial(softmax(A/η))`); η ≤ 0 picks the argmax (ties: the lowest row index).

  Args:
    key: PRNG key.
    advantages_B: [B] float step advantages (one per candidate row).
    node_ids: [B] int node of each row (e.g. `slate_node_ids`).
    eta: temperature η (default 0.7, `configs/slate.yaml`).
    valid: optional [B] bool, the candidates that may be picked.

  Returns:
    [B] bool, True on the chosen row of each node that has a valid candidate.
  """
  adv = as_f32(advantages_B)
  nid = jnp.asarray(node_ids, jnp.int32)
  chex.assert_rank([adv, nid], 1)
  chex.assert_equal_shape([adv, nid])
  ok = jnp.ones(adv.shape, bool) if valid is None else jnp.asarray(valid, bool)
  eta = jnp.asarray(eta, jnp.float32)
  g = jax.random.gumbel(key, adv.shape, jnp.float32)
  score = jnp.where(eta > 0, adv / jnp.where(eta > 0, eta, 1.0) + g, adv)
  score = jnp.where(ok, score, -jnp.inf)
  B = adv.shape[0]
  same = (nid[:, None] == nid[None, :]) & ok[None, :]
  lower = jnp.arange(B)[None, :] < jnp.arange(B)[:, None]
  beaten = same & ((score[None, :] > score[:, None]) | ((score[None, :] == score[:, None])
                                                        & lower))
  return ok & ~jnp.any(beaten, axis=1)


def slate_answer_bonus(step_index: ArrayLike, max_steps: ArrayLike = 4,
                       coef: ArrayLike = 0.1) -> Array:
  """Early-answer bonus λ·(B_max − t)/B_max of an answer at 0-based step t (code: no clip)."""
  t = as_f32(step_index)
  b_max = as_f32(max_steps)
  return as_f32(coef) * (b_max - t) / b_max


def slate_step_reward(think: ArrayLike, query_or_answer: ArrayLike, is_answer: ArrayLike,
                      step_index: ArrayLike, *, max_steps: ArrayLike = 4,
                      coef: ArrayLike = 0.1) -> Array:
  """The ternary judge's step reward (paper Eqs. 3–4, `llm_judge.py`).

  search step: r = r_think + r_query;  answer step: r = r_think + r_answer + bonus(t),
  each judge score in {−1, 0, +1} (a parse failure scores 0).

  >>> round(float(slate_step_reward(1.0, 1.0, True, 1)), 6)
  2.075
  """
  r = as_f32(think) + as_f32(query_or_answer)
  bonus = slate_answer_bonus(step_index, max_steps, coef)
  return r + jnp.where(jnp.asarray(is_answer, bool), bonus, 0.0)
