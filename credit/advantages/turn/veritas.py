"""VERITAS: turn-level faithfulness rewards added to the outcome, group-normalised per turn."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["veritas_advantages"]

_PAPER = ("Beyond Correctness: Rewarding Faithful Reasoning in Retrieval-Augmented Generation "
          "(VERITAS), arXiv 2510.13272")


@register_estimator("veritas", needs=("reward", "step_reward", "step_mask", "turn_id",
                                      "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",))
def veritas_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                       turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, faith_coef: ArrayLike = 1.0,
                       eps: float = 1e-6) -> Array:
  """Turn reward = outcome + λ·faithfulness of the turn, z-scored over the group's turns.

  Confidence: inferred. Only the abstract and third-party summaries were found
  (arXiv 2510.13272, "Verifying Entailed Reasoning through Intermediate Traceability in
  Agentic Search"): reward models score each turn for Information-Think, Think-Search and
  Think-Answer faithfulness, and these "fine-grained turn-level faithfulness rewards" enter
  RL next to the episode outcome. The weights and the advantage form are not known. Array
  form chosen here (the faithfulness scores are summed into `step_reward` by the caller):

  .. math::
    r_{b,k} = R_b + λ·f_{b,k}
    A_{b,k} = (r_{b,k} − μ_g)/(σ_g + eps)      (every valid turn of the prompt group)

  unbiased std; fewer than two turns → 0.

  Args:
    reward: [B] outcome (e.g. exact match); step_reward: [B,K] faithfulness score f of turn k;
    step_mask: [B,K] bool; turn_id: [B,T] int (−1 outside turns); group_id: [B];
    num_groups: static; response_mask: [B,T] bool.
    faith_coef: λ (1; ours).
    eps: added to the std.

  Returns:
    [B,T] float32, tokens of turn k get A_{b,k}, 0 elsewhere.
  """
  rows = ops.group_rows("veritas_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  f_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([f_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  r_BK = rows.values[:, None] + faith_coef * jnp.where(valid_BK, f_BK, 0.0)
  adv_BK = ops.turn_normalize(r_BK, valid_BK, rows.group_id, num_groups, ddof=1, eps=eps)
  return ops.turn_broadcast(adv_BK, tid, rows.mask)
