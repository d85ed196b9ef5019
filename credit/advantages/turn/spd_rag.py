"""SPD-RAG: role-decoupled outcome credit for coordinator / document agents / synthesis,
with a per-turn token-budget penalty (an array form inferred from the architecture)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["spd_rag_advantages"]

_PAPER = ("SPD-RAG: Sub-Agent Per Document Retrieval-Augmented Generation (an inference-time "
          "method; the training credit here is the library's), arXiv 2603.08329")


@register_estimator("spd_rag", needs=("reward", "step_mask", "turn_role", "turn_id", "group_id",
                                      "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "num_roles"),
                    confidence="inferred",
                    source=_PAPER + " (its architecture; the training credit is this library's)")
def spd_rag_advantages(*, reward: ArrayLike, step_mask: ArrayLike, turn_role: ArrayLike,
                       turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, num_roles: int = 3, token_budget: ArrayLike = 512.0,
                       budget_coef: ArrayLike = 0.1, eps: float = 1e-6) -> Array:
  """Per-role outcome credit with a token-budget penalty for a multi-agent RAG trajectory.

  Every agent call of one trajectory is a turn, its agent type `turn_role` (0
  coordinator, 1 document agent, 2 synthesis); a call is compared only with calls of the
  same type, and pays for tokens over its budget::

    L[b,k] = number of policy tokens of turn k
    r[b,k] = R_b − c max(0, L[b,k] − B_tok) / B_tok
    a[b,k] = (r[b,k] − μ_{g,ρ}) / (σ_{g,ρ} + eps),   ρ = turn_role[b,k]

  μ, σ (unbiased) pool the valid turns of role ρ over the prompt group; a pool with one
  turn gives 0. Under the budget this is role-decoupled GRPO of the outcome.

  Paper: "SPD-RAG: Sub-Agent Per Document Retrieval-Augmented Generation",
  arXiv 2603.08329. SPD-RAG is an inference-time architecture with no training objective;
  this credit (the outcome for every agent, a per-call token budget) is this library's.

  Args:
    reward: [B] final-answer reward R.
    step_mask: [B,K] bool agent calls that ran.
    turn_role: [B,K] int agent type.
    turn_id: [B,T] int (−1 outside calls).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    num_roles: static number of agent types.
    token_budget: B_tok, token budget of one call.
    budget_coef: c, weight of the over-budget penalty.
    eps: added to the std.

  Returns:
    [B,T] float32; tokens of call k get a[b,k], 0 elsewhere.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = spd_rag_advantages(reward=np.array([1., 0.]), step_mask=np.ones((2, 2), bool),
    ...     turn_role=np.array([[0, 1], [0, 1]]), turn_id=tid, group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.7071, 0.7071, 0.7071, 0.7071], [-0.7071, -0.7071, -0.7071, -0.7071]]
  """
  check_int("spd_rag_advantages", "num_roles", num_roles)
  rows = ops.group_rows("spd_rag_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  role_BK = jnp.asarray(turn_role, jnp.int32)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([valid_BK, role_BK])
  chex.assert_equal_shape([tid, rows.mask])
  K = valid_BK.shape[1]
  len_BK = ops.turn_reduce(jnp.zeros(tid.shape), tid, K, mask=rows.mask, reduce="count")
  over_BK = jnp.maximum(len_BK - token_budget, 0.0) / jnp.maximum(token_budget, 1.0)
  r_BK = rows.values[:, None] - budget_coef * over_BK
  adv_BK = ops.turn_normalize(r_BK, valid_BK, rows.group_id, num_groups, by="key", key=role_BK,
                              num_keys=num_roles, ddof=1, eps=eps)
  return ops.turn_broadcast(adv_BK, tid, rows.mask)
