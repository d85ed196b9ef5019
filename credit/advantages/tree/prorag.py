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
          "Generation (arXiv id not given in the seeds); code github.com/lilinwz/ProRAG")


@register_estimator(
    "prorag", needs=("reward", "step_reward", "step_mask", "step_id", "group_id",
                     "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "group_size"))
def prorag_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                      step_id: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                      num_groups: int, group_size: int | None = None,
                      beta: ArrayLike = 0.3, eps: ArrayLike = 1e-4,
                      var_eps: ArrayLike = 1e-8) -> Array:
  """ProRAG dual-granularity advantage: outcome GRPO + β · token-weighted z-score of PRM scores.

  Confidence: code-verified (lilinwz/ProRAG `prorag/rl/trainer.py` `_generate_and_score`
  advantage block, `prorag/rl/rollout.py` `rag_rollout_with_prm`, `scripts/rl.sh`; read
  for this module), `shared/methods/distill_and_structure.md` B8 + "Corrections".

  Paper: "ProRAG: Process-Supervised Reinforcement Learning for RAG" (arXiv id not given in
  the seeds). With s_{b,k} = `step_reward` (the PRM score of step k: sigmoid of the PRM
  logit plus the step's format reward, computed by the loop) copied onto the tokens of
  step k (`step_id`), and m the tokens of valid steps:

  .. math::
    A_o[b] = (r_b − μ_g) / (σ_g + ε)                     (σ unbiased, ε = 1e-4)
    μ'_g = Σ_{b∈g,t} m s / Σ m,  σ'_g = sqrt(Σ m (s − μ')² / Σ m + 1e-8)  (σ' = 1 if Σ m ≤ 1)
    A[b,t] = (A_o[b] + β (s_{b,k(t)} − μ'_g)/σ'_g) · M[b,t]

  The step statistics are token-weighted (a long step weighs more, as in the code) and
  pooled over the whole prompt group. Defaults: β = 0.3 (the run script; the trainer
  class default is 0.5), G = 8 in the recipe.

  Differences from the code (the "Corrections"): A_o is masked (the code leaves A_o on
  padding); a group with fewer than 2 valid rows gives 0 on all its tokens (the code's
  torch std is NaN there and poisons the whole row). Choices (ours): response tokens
  outside any valid step (step_id −1 or a step off in `step_mask`) get A_o alone and take
  no part in μ', σ' (the code masks retrieved-document tokens the same way); rows with an
  empty response take no part in any statistic.

  Args:
    reward: [B] float outcome rewards.
    step_reward: [B,K] float PRM score of each step (read where `step_mask`).
    step_mask: [B,K] bool, the steps that exist.
    step_id: [B,T] int step of each token (−1 outside steps).
    group_id: [B] int prompt group in [0, num_groups); unused when `group_size` is set.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups. group_size: static G of the contiguous fast path.
    beta: β, weight of the step term. eps: ε on the outcome std. var_eps: added to the
      step variance inside the root.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

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

