"""River: outcome reward augmented with process-level behaviour regularisation (GRPO)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["river_advantages"]

_PAPER = ("Learning Generalizable Behaviors for Terminal Agents (River; seed abstract, no "
          "arXiv id found), https://huggingface.co/papers?q=Learning+Generalizable+Behaviors"
          "+for+Terminal+Agents")


@register_estimator("river", needs=("reward", "step_reward", "step_mask", "group_id",
                                    "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",))
def river_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                     group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                     behavior_coef: ArrayLike = 0.1, eps: float = 1e-6) -> Array:
  """GRPO on the outcome plus a mean per-turn behaviour score (trajectory-level credit).

  Confidence: inferred. Only the abstract was found: River "improves reward quality by
  filtering low-quality environments and augmenting outcome rewards with process-level
  behavior regularization". Environment filtering is a data-selection step outside any
  estimator (drop the prompts whose verifier is unreliable before sampling). The behaviour
  regulariser is read as a per-turn behaviour score b_{b,k} (e.g. +1 inspect/verify, −1 a
  forbidden or repeated command) in `step_reward`, averaged over the turns and added to the
  outcome:

  .. math::
    R̃_b = R_b + λ·mean_{k valid} b_{b,k},      A_b = (R̃_b − μ_g)/(σ_g + eps)

  (unbiased std; a row without valid turns adds nothing; singleton groups → 0). Every policy
  token of the row gets A_b.

  Args:
    reward: [B] outcome; step_reward: [B,K] behaviour score of each turn;
    step_mask: [B,K] bool; group_id: [B]; num_groups: static; response_mask: [B,T] bool.
    behavior_coef: λ (0.1; ours, a regulariser should not outweigh the outcome).
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.
  """
  rows = ops.group_rows("river_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  s_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  chex.assert_equal_shape([s_BK, valid_BK])
  n_B = jnp.sum(valid_BK, axis=1).astype(jnp.float32)
  mean_B = jnp.sum(jnp.where(valid_BK, s_BK, 0.0), axis=1) / jnp.maximum(n_B, 1.0)
  shaped_B = rows.values + behavior_coef * mean_B
  adv_B = ops.turn_normalize(shaped_B[:, None], rows.valid[:, None], rows.group_id, num_groups,
                             ddof=1, eps=eps)[:, 0]
  return ops.broadcast_to_tokens(adv_B, rows.mask)
