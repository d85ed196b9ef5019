"""TACO: per-tool-call differential answer-probe reward (DAPR) + outcome-gated advantage
routing (OGAR)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["taco_advantages"]

_PAPER = ("TACO: Tool-Augmented Credit Optimization for Agentic Tool Use, arXiv 2606.30251")


@register_estimator("taco", needs=("reward", "step_reward", "step_mask", "turn_id", "group_id",
                                   "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def taco_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                    turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, probe_coef: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """TACO two-channel advantage for code-tool agents: probe value of each call, routed outcome.

  DAPR: probe tokens make the model answer with and without each tool call, and the
  difference of the checker's reward is the call's value d (> 0 useful, < 0 misleading, 0
  no effect), computed outside and passed as `step_reward`. OGAR routes the outcome
  advantage only to the calls responsible for it. Every valid turn but the row's last is a
  tool call; the last is the answer and always receives A_b::

    A_b = (R_b − μ_g) / (σ_g + eps)
    gate[b,k] = [d > 0] if A_b > 0;   [d ≤ 0] if A_b < 0          (call turns)
    a[b,k] = gate[b,k] A_b + κ d[b,k]

  so a success reinforces only useful calls, a failure penalises only misleading and
  wasted calls, and a wasted call is never reinforced.

  Paper: "TACO: Tool-Augmented Credit Optimization for Agentic Tool Use",
  arXiv 2606.30251. The abstract names the two channels; the array form and κ = 1 are this
  library's.

  Args:
    reward: [B] outcome.
    step_reward: [B,K] probe value d of each tool call.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    probe_coef: κ, weight of the probe channel.
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)   # turn 0 a call, turn 1 the answer
    >>> a = taco_advantages(reward=np.array([1., 0.]), step_reward=np.array([[1., 0.],
    ...     [0., 0.]]), step_mask=np.ones((2, 2), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.7071, 1.7071, 0.7071, 0.7071], [-0.7071, -0.7071, -0.7071, -0.7071]]
  """
  rows = ops.group_rows("taco_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  d_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([d_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  K = d_BK.shape[1]
  a_B = ops.turn_normalize(rows.values[:, None], rows.valid[:, None], rows.group_id, num_groups,
                           ddof=1, eps=eps)[:, 0]
  d_BK = jnp.where(valid_BK, d_BK, 0.0)
  answer_BK = valid_BK & (ops.turn_counts(valid_BK) == 1.0)
  pos = (a_B > 0)[:, None]
  gate_BK = answer_BK | jnp.where(pos, d_BK > 0, d_BK <= 0)
  call_BK = jnp.where(answer_BK, 0.0, probe_coef * d_BK)
  turn_BK = jnp.where(valid_BK, jnp.where(gate_BK, a_B[:, None], 0.0) + call_BK, 0.0)
  in_turn = (tid >= 0) & (tid < K)
  adv_BT = jnp.where(in_turn, ops.turn_broadcast(turn_BK, tid), a_B[:, None])
  return jnp.where(rows.mask, adv_BT, 0.0)
