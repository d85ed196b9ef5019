"""DataPRM: ternary (+1 / 0 / −1) process rewards of a generative PRM as turn credit."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["dataprm_advantages"]

_PAPER = ("Rewarding the Scientific Process: Process-Level Reward Modeling for Agentic Data "
          "Analysis (DataPRM), arXiv 2604.24198, https://github.com/zjunlp/DataMind")


@register_estimator("dataprm", needs=("reward", "step_reward", "step_mask", "turn_id",
                                      "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",))
def dataprm_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                       turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, process_coef: ArrayLike = 1.0,
                       eps: float = 1e-6) -> Array:
  """Outcome GRPO advantage plus a group-normalised ternary process advantage per turn.

  Confidence: inferred. Only the abstract was found (arXiv 2604.24198; repository
  zjunlp/DataMind, whose stored snapshot holds no DataPRM training code). The abstract says
  the PRM gives a *reflection-aware ternary* step reward that separates correctable
  grounding errors (exploration that is later fixed: neutral, 0) from irrecoverable mistakes
  (−1), correct steps being +1, and that the PRM is "integrated into RL" over an outcome-reward
  baseline; how the two are combined is not stated. Array form chosen here:

  .. math::
    q_{b,k} = clip(s_{b,k}, −1, 1)                    (the PRM's ternary label of turn k)
    A_{b,k} = z_g(R)_b + w·(q_{b,k} − μ_g^q)/(σ_g^q + eps)

  z_g is the group z-score of the outcome (unbiased std); μ_g^q, σ_g^q pool every valid turn
  of the prompt group (unbiased; fewer than two turns → 0). The ternary labelling itself
  (the PRM probing the environment) happens outside the library, in `step_reward`.

  Args:
    reward: [B] outcome; step_reward: [B,K] ternary PRM label per turn (+1, 0, −1);
    step_mask: [B,K] bool; turn_id: [B,T] int (−1 outside turns); group_id: [B];
    num_groups: static; response_mask: [B,T] bool.
    process_coef: w (1; ours).
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.
  """
  rows = ops.group_rows("dataprm_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  q_BK = jnp.clip(jnp.asarray(step_reward, jnp.float32), -1.0, 1.0)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([q_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  out_B = ops.turn_normalize(rows.values[:, None], rows.valid[:, None], rows.group_id,
                             num_groups, ddof=1, eps=eps)[:, 0]
  proc_BK = ops.turn_normalize(q_BK, valid_BK, rows.group_id, num_groups, ddof=1, eps=eps)
  adv_BT = ops.broadcast_to_tokens(out_B, rows.mask) + process_coef * ops.turn_broadcast(
      proc_BK, tid, rows.mask)
  return jnp.where(rows.mask, adv_BT, 0.0)
