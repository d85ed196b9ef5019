"""Process-verified Lean RL: first-error propagation, credit on each step's first token."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops._cast import as_f32
from credit.ops.turns import row_grpo, turn_broadcast, turn_edges, turn_layout
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["lean_first_error_advantages", "first_error_rewards"]

_PAPER = "Process-Verified Reinforcement Learning for Theorem Proving via Lean, arXiv preprint"


def first_error_rewards(step_ok: ArrayLike, valid_BK: ArrayLike) -> Array:
  """q [B,K]: +1 on valid steps before the first failing valid step, −1 from it on, 0 invalid."""
  valid = jnp.asarray(valid_BK, bool)
  bad = valid & ~jnp.asarray(step_ok, bool)
  failed = jax.lax.cummax(bad.astype(jnp.int32), axis=1) > 0
  return jnp.where(valid, jnp.where(failed, -1.0, 1.0), 0.0)


@register_estimator(
    "lean_first_error", needs=("reward", "step_reward", "step_mask", "turn_id", "group_id",
                               "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "mode", "singleton"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def lean_first_error_advantages(*, reward: ArrayLike, step_reward: ArrayLike,
                                step_mask: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                                response_mask: ArrayLike, num_groups: int,
                                mode: Literal["first_token", "propagate"] = "first_token",
                                coef: ArrayLike = 0.5, eps: float = 1e-6,
                                singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GRPO plus first-error process credit from a step verifier (Lean's elaboration).

  Lean checks each tactic; every step before the first failing one is sound, the first
  failing one and everything after are not::

    f_b = first valid step s with not ok[b,s] (K_b if none),   q[b,s] = +1 (s < f_b), −1 (s ≥ f_b)
    first_token: A[b,t] = Â_b + α Σ_s q[b,s] [t = first policy token of step s]
    propagate:   A[b,t] = Â_b + α q[b,s(t)]                    (every token of the step)

  with Â the GRPO advantage of the outcome and ok = `step_reward > 0`. A step is a turn of
  the contract (`turn_id`). A proof that compiles without closing the goal has every step
  ok and a negative outcome advantage.

  Paper: "Process-Verified Reinforcement Learning for Theorem Proving via Lean" (arXiv
  preprint). The abstract gives the first-error idea; the placement and α = 0.5 are this
  library's.

  Args:
    reward: [B] outcome.
    step_reward: [B,K] step verdicts (> 0 = sound).
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    mode: static "first_token" | "propagate".
    coef: α.
    eps: added to σ.
    singleton: static, a lone row's GRPO term: "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = lean_first_error_advantages(reward=np.array([1., 0.]), step_reward=np.array(
    ...     [[1., 1.], [1., 0.]]), step_mask=np.ones((2, 2), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.2071, 0.7071, 1.2071, 0.7071], [-0.2071, -0.7071, -1.2071, -0.7071]]
  """
  check_choice("lean_first_error_advantages", "mode", mode, ("first_token", "propagate"))
  check_choice("lean_first_error_advantages", "singleton", singleton, ("zero", "raw"))
  mask_BT, row, valid, _, tid = turn_layout(response_mask, step_mask, turn_id)
  ok = jnp.where(valid, as_f32(step_reward), 0.0) > 0
  q_BT = turn_broadcast(first_error_rewards(ok, valid), tid, mask_BT)
  if mode == "first_token":
    q_BT = jnp.where(turn_edges(tid, mask_BT, valid.shape[1], last=False), q_BT, 0.0)
  a_B = row_grpo(reward, row, group_id, num_groups, ddof=1, eps=eps, singleton=singleton)
  return jnp.where(mask_BT & row[:, None], a_B[:, None] + coef * q_BT, 0.0)
