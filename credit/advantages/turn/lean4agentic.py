"""Lean4AgenticRL: workflow-stage-normalised GRPO (outcome z-score + per-stage z-scores)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["lean4agentic_advantages"]

_PAPER = ("Lean4AgenticRL: Advancing Agentic RL with Verifiable Multi-level Process Rewards "
          "(seed abstract, no arXiv id in the seed), "
          "https://huggingface.co/papers?q=Lean4AgenticRL")


@register_estimator("lean4agentic", needs=("reward", "step_reward", "step_mask", "turn_role",
                                           "turn_id", "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "num_stages"))
def lean4agentic_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                            turn_role: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                            response_mask: ArrayLike, num_groups: int, num_stages: int = 8,
                            outcome_weight: ArrayLike = 1.0, stage_weight: ArrayLike = 1.0,
                            eps: float = 1e-6) -> Array:
  """Workflow-stage-normalised GRPO advantage.

  Confidence: inferred (seed abstract; spec outcome_and_clipping.md §10 is a proposal and its
  worked example is reproduced).

  .. math::
    a^{out}_b = (R_b − μ_g)/(σ_g + eps)
    a^{stage}_{b,k} = (s_{b,k} − μ_{g,σ})/(σ_{g,σ} + eps),   σ = stage of turn k
    A_{b,t} = w_o·a^{out}_b + w_s·a^{stage}_{b,k(t)}

  Array form: the workflow stage of each turn is `turn_role` (ids in [0, num_stages)), the
  verifiable stage reward is `step_reward`. Statistics pool the valid turns of one stage
  within the prompt group (a stage that spans several turns of a row should carry its reward
  on one of them, or each turn counts as one item); unbiased std; fewer than two items → 0.
  Policy tokens outside any turn get the outcome part only. The tool-call level (w_c, a third
  set of per-call rewards) has no contract field and is not implemented.

  Args:
    reward: [B] outcome R.
    step_reward: [B,K] stage reward of each turn.
    step_mask: [B,K] bool, turns that took place.
    turn_role: [B,K] int workflow stage of each turn.
    turn_id: [B,T] int, −1 outside turns.
    group_id: [B]; num_groups: static.
    response_mask: [B,T] bool policy tokens.
    num_stages: static number of stage ids (8; ids outside are ignored).
    outcome_weight, stage_weight: w_o, w_s (1, 1).
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.
  """
  check_int("lean4agentic_advantages", "num_stages", num_stages)
  rows = ops.group_rows("lean4agentic_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  s_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  stage_BK = jnp.asarray(turn_role, jnp.int32)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([s_BK, valid_BK, stage_BK])
  chex.assert_equal_shape([tid, rows.mask])
  out_B = ops.turn_normalize(rows.values[:, None], rows.valid[:, None], rows.group_id,
                             num_groups, ddof=1, eps=eps)[:, 0]
  stage_adv_BK = ops.turn_normalize(s_BK, valid_BK, rows.group_id, num_groups, by="key",
                                    key=stage_BK, num_keys=num_stages, ddof=1, eps=eps)
  adv_BT = (outcome_weight * ops.broadcast_to_tokens(out_B, rows.mask)
            + stage_weight * ops.turn_broadcast(stage_adv_BK, tid, rows.mask))
  return jnp.where(rows.mask, adv_BT, 0.0)
