"""ProCredit: verified task progress, differenced per turn, credited on top of GRPO."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops._cast import as_f32
from credit.ops.turns import (previous_valid, row_grpo, turn_broadcast, turn_layout,
                               turn_normalize)
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["procredit_advantages", "row_grpo"]

_PAPER = ("ProCredit: From Outcome Rewards to Progress Credit in Agentic Reinforcement "
          "Learning, arXiv preprint")


@register_estimator(
    "procredit", needs=("reward", "turn_progress", "step_mask", "turn_id", "group_id",
                        "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "singleton"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def procredit_advantages(*, reward: ArrayLike, turn_progress: ArrayLike, step_mask: ArrayLike,
                         turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                         num_groups: int, turn_coef: ArrayLike = 1.0, eps: float = 1e-6,
                         singleton: Literal["zero", "raw"] = "zero") -> Array:
  """ProCredit: A = A_grpo(outcome) + λ · z-score(progress gain of the turn).

  Verified task progress (e.g. the fraction of acceptance checks passing after each turn)
  is differenced per turn and credited on top of GRPO::

    u[b,k]  = p[b,k] − p[b,k−1]                     (p[b,0] = 0)
    A_traj  = (R_b − μ_g) / (σ_g + 1e-6)             (unbiased σ)
    A_turn  = (u − μ_g^u) / (σ_g^u + 1e-6)           (population σ over the group's valid turns)
    A[b,t]  = A_traj[b] + λ A_turn[b,k(t)]

  All-fail groups still get turn signal; regressions give negative u. Missing turns are
  skipped; a lone row or turn cell gives 0 (`singleton="raw"` keeps the value).

  Paper: "ProCredit: From Outcome Rewards to Progress Credit in Agentic Reinforcement
  Learning" (arXiv preprint). The abstract describes progress credit; the formulas and
  λ = 1 are this library's reading.

  Args:
    reward: [B] success / outcome.
    turn_progress: [B,K] progress in [0,1] after turn k.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    turn_coef: λ.
    eps: added to the stds.
    singleton: static, "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`; tokens outside any turn get
    A_traj only.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 1, 2], [0, 1, 2]], np.int32)
    >>> a = procredit_advantages(reward=np.array([1., 0.]), turn_progress=np.array(
    ...     [[.25, .25, 1.], [.5, .5, .5]]), step_mask=np.ones((2, 3), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=tid >= 0, num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.7071, -0.1589, 2.4392], [0.1589, -1.5731, -1.5731]]
  """
  check_choice("procredit_advantages", "singleton", singleton, ("zero", "raw"))
  mask_BT, row, valid, _, tid = turn_layout(response_mask, step_mask, turn_id)
  p = jnp.where(valid, as_f32(turn_progress), 0.0)
  u = jnp.where(valid, p - previous_valid(p, valid, jnp.zeros(p.shape[0])), 0.0)
  a_turn = turn_normalize(u, valid, group_id, num_groups, by="pooled", ddof=0, eps=eps,
                          small=singleton)
  a_traj = row_grpo(reward, row, group_id, num_groups, ddof=1, eps=eps, singleton=singleton)
  adv = a_traj[:, None] + turn_coef * turn_broadcast(a_turn, tid)
  return jnp.where(mask_BT & row[:, None], adv, 0.0)
