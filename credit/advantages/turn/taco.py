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
                    paper=_PAPER, static_argnames=("num_groups",))
def taco_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                    turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, probe_coef: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """TACO two-channel advantage for code-tool agents.

  Confidence: inferred (abstract of arXiv 2606.30251 only; no code found).

  DAPR: probe tokens make the model answer with and without each tool call; the difference
  of the answer checker's reward is the call's value, `d_{b,k} = R(with call k) − R(without)`
  (> 0 useful, < 0 misleading, 0 no effect), computed outside and passed as `step_reward`.
  OGAR: the outcome advantage A_b (group z-score) is routed only to the segments responsible
  for it, conditioned on the call's effect, with no cost term. Array form chosen here: every
  valid turn except the row's last is a tool-call segment; the last valid turn is the answer
  segment and always receives A_b, as do policy tokens outside any turn.

  .. math::
    A_b = (R_b − μ_g)/(σ_g + eps)
    gate_{b,k} = [d_{b,k} > 0] if A_b > 0;  [d_{b,k} ≤ 0] if A_b < 0     (call segments)
    a_{b,k} = gate_{b,k}·A_b + κ·d_{b,k}

  so a successful trajectory reinforces only useful calls, a failed one penalises only the
  misleading and wasted calls, and a wasted call (d = 0) is never reinforced.

  Args:
    reward: [B] outcome; step_reward: [B,K] DAPR value d of each tool call;
    step_mask: [B,K] bool; turn_id: [B,T] int (−1 outside turns); group_id: [B];
    num_groups: static; response_mask: [B,T] bool.
    probe_coef: κ, weight of the DAPR channel (1; ours).
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.
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
