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
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def dataprm_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                       turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, process_coef: ArrayLike = 1.0,
                       eps: float = 1e-6) -> Array:
  """Outcome GRPO advantage plus a group-normalised ternary process advantage per turn.

  A generative PRM gives each turn a reflection-aware ternary label: +1 a correct step,
  0 a grounding error that is later corrected (exploration), −1 an irrecoverable mistake::

    q[b,k] = clip(s[b,k], −1, 1)
    A[b,k] = z_g(R)_b + w · (q[b,k] − μ_g^q) / (σ_g^q + eps)

  with z_g the outcome's group z-score and μ^q, σ^q pooled over every valid turn of the
  prompt group (unbiased; fewer than two turns give 0). The labelling itself happens
  outside, in `step_reward`.

  Paper: "Rewarding the Scientific Process: Process-Level Reward Modeling for Agentic Data
  Analysis" (DataPRM), arXiv 2604.24198. The abstract gives the ternary labels; how they
  combine with the outcome, and w = 1, are this library's.

  Args:
    reward: [B] outcome.
    step_reward: [B,K] ternary PRM label per turn (+1, 0, −1).
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    process_coef: w.
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = dataprm_advantages(reward=np.array([1., 0.]), step_reward=np.array([[1., 1.],
    ...     [1., -1.]]), step_mask=np.ones((2, 2), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.2071, 1.2071, 1.2071, 1.2071], [-0.2071, -0.2071, -2.2071, -2.2071]]
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
