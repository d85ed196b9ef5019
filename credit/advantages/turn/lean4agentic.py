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

_PAPER = ("Lean4AgenticRL: Advancing Agentic RL with Verifiable Multi-level Process Rewards, "
          "arXiv preprint")


@register_estimator("lean4agentic", needs=("reward", "step_reward", "step_mask", "turn_role",
                                           "turn_id", "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "num_stages"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def lean4agentic_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                            turn_role: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                            response_mask: ArrayLike, num_groups: int, num_stages: int = 8,
                            outcome_weight: ArrayLike = 1.0, stage_weight: ArrayLike = 1.0,
                            eps: float = 1e-6) -> Array:
  """Workflow-stage-normalised GRPO advantage.

  The outcome is z-scored per prompt group, and each turn's verifiable stage reward is
  z-scored among the turns of the same workflow stage in the group::

    a_out[b]    = (R_b − μ_g) / (σ_g + eps)
    a_stage[b,k] = (s[b,k] − μ_{g,σ}) / (σ_{g,σ} + eps),   σ = the stage of turn k
    A[b,t] = w_o a_out[b] + w_s a_stage[b,k(t)]

  The stage of each turn is `turn_role` (ids in [0, num_stages)), the stage reward
  `step_reward`. Unbiased std; fewer than two items give 0; policy tokens outside any turn
  get the outcome part only.

  Paper: "Lean4AgenticRL: Advancing Agentic RL with Verifiable Multi-level Process
  Rewards" (arXiv preprint). The abstract names the levels but gives no equation: the form
  above is this library's; the tool-call level has no contract field and is not built.

  Args:
    reward: [B] outcome R.
    step_reward: [B,K] stage reward of each turn.
    step_mask: [B,K] bool, turns that took place.
    turn_role: [B,K] int workflow stage of each turn.
    turn_id: [B,T] int, −1 outside turns.
    group_id: [B] int prompt group.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups.
    num_stages: static number of stage ids (ids outside are ignored).
    outcome_weight: w_o.
    stage_weight: w_s.
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = lean4agentic_advantages(reward=np.array([1., 0.]), step_reward=np.array(
    ...     [[1., .5], [0., .5]]), turn_role=np.array([[0, 1], [0, 1]]),
    ...     step_mask=np.ones((2, 2), bool), turn_id=tid, group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.4142, 1.4142, 0.7071, 0.7071], [-1.4142, -1.4142, -0.7071, -0.7071]]
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
