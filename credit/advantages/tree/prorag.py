"""ProRAG: GRPO outcome advantage plus a group-normalised PRM step score on every token."""
from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.tree._common import (check_steps, pooled_zscore, prorag_outcome,
                                           step_tokens)
from credit.contract import validate_fields
from credit.ops._cast import as_f32
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["prorag_advantages", "prorag_outcome", "pooled_zscore", "validate_prorag_inputs"]

_PAPER = ("ProRAG: Process-Supervised Reinforcement Learning for Retrieval-Augmented "
          "Generation, arXiv preprint; code github.com/lilinwz/ProRAG")


@register_estimator(
    "prorag", needs=("reward", "step_reward", "step_mask", "step_id", "group_id",
                     "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "group_size"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: lilinwz/ProRAG prorag/rl/trainer.py "
                            "(_generate_and_score), prorag/rl/rollout.py (rag_rollout_with_prm), "
                            "scripts/rl.sh"))
def prorag_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                      step_id: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                      num_groups: int, group_size: int | None = None,
                      beta: ArrayLike = 0.3, eps: ArrayLike = 1e-4,
                      var_eps: ArrayLike = 1e-8) -> Array:
  """ProRAG dual-granularity advantage: outcome GRPO + β · token-weighted z-score of PRM scores.

  With s[b,k] = `step_reward` (the PRM score of step k, copied onto the tokens of step k
  by `step_id`) and m the tokens of valid steps::

    A_o[b] = (r_b − μ_g) / (σ_g + ε)                            (unbiased σ, ε = 1e-4)
    μ'_g = Σ_{b∈g,t} m s / Σ m,   σ'_g = sqrt(Σ m (s − μ')² / Σ m + 1e-8)
    A[b,t] = (A_o[b] + β (s[b,k(t)] − μ'_g) / σ'_g) · M[b,t]

  The step statistics are token-weighted (a long step weighs more) and pooled over the
  whole prompt group; σ' = 1 with at most one token. β = 0.3 as the authors' run script.

  Paper: "ProRAG: Process-Supervised Reinforcement Learning for Retrieval-Augmented
  Generation". Differences from the authors' code: A_o is masked (the code leaves it on
  padding), and a group with fewer than 2 valid rows gives 0 (the code's NaN std poisons
  the row). Tokens outside every valid step get A_o alone.

  Args:
    reward: [B] float outcome rewards.
    step_reward: [B,K] float PRM score of each step (read where `step_mask`).
    step_mask: [B,K] bool, the steps that exist.
    step_id: [B,T] int step of each token (−1 outside steps).
    group_id: [B] int prompt group in [0, num_groups); unused when `group_size` is set.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups.
    group_size: static G of the contiguous fast path.
    beta: β, weight of the step term.
    eps: ε on the outcome std.
    var_eps: added to the step variance inside the root.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = prorag_advantages(reward=np.array([1., 0.]), step_reward=np.array([[.9, .2],
    ...     [.5, 0.]]), step_mask=np.array([[1, 1], [1, 0]], bool), step_id=np.array(
    ...     [[0, 0, 1], [0, 0, -1]], np.int32), group_id=np.zeros(2, np.int32),
    ...     response_mask=np.array([[1, 1, 1], [1, 1, 0]], bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 5).tolist()
    [[1.04242, 1.04242, 0.25979], [-0.81881, -0.81881, 0.0]]
  """
  reward_B, gid_B, _, valid_B = ops.group_rows(
      "prorag_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  mask_BT, _, sid_BT, tok_ok = step_tokens(response_mask, step_mask, step_id)
  s_BK = as_f32(step_reward)
  chex.assert_equal_shape([s_BK, jnp.asarray(step_mask)])
  a_o, big_B = prorag_outcome(reward_B, gid_B, valid_B, num_groups, group_size, eps)
  tok_ok = tok_ok & big_B[:, None]
  s_BT = ops.turn_broadcast(jnp.where(jnp.asarray(step_mask, bool), s_BK, 0.0), sid_BT, tok_ok)
  z_BT = pooled_zscore(s_BT, tok_ok, gid_B, num_groups, group_size, var_eps)
  adv = a_o[:, None] + jnp.asarray(beta, jnp.float32) * z_BT
  return jnp.where(mask_BT & big_B[:, None], adv, 0.0)


def validate_prorag_inputs(*, num_groups: int | None = None, **fields: Any) -> None:
  """Eager checks before tracing: contract shapes/dtypes, finite rewards and step scores
  (under `step_mask`), a non-empty `response_mask`, `step_id` < K. Raises ContractError."""
  validate_fields(fields, num_groups=num_groups, where="prorag")
  check_steps("prorag", fields)

