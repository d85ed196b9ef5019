"""IterSynth RDPO: role-decoupled advantages (outcome + turn rubric, normalised per role)."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["rdpo_advantages"]

_PAPER = ("IterSynth: Rethinking Deep Search Agents via Role-Decoupled Iterative Synthesis "
          "(RDPO), arXiv preprint")

COMBINE = ("reward", "advantage")


@register_estimator("rdpo", needs=("reward", "step_reward", "step_mask", "turn_role", "turn_id",
                                   "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "num_roles", "combine"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def rdpo_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                    turn_role: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, num_roles: int = 2,
                    beta: ArrayLike = 1.0, combine: Literal["reward", "advantage"] = "reward",
                    eps: float = 1e-6) -> Array:
  """Role-Decoupled Policy Optimization (RDPO) advantage.

  A planner and a synthesiser role take turns in one trajectory; each turn's reward (the
  outcome plus its rubric score) is normalised only against the turns of the same role::

    r[b,k] = R_b + β u[b,k]                         (u = turn rubric score, `step_reward`)
    a[b,k] = (r[b,k] − μ_{g,ρ}) / (σ_{g,ρ} + eps),   ρ = turn_role[b,k]

  μ, σ (unbiased) pool every valid turn that role ρ played in group g; a pool with one
  turn gives 0. `combine="advantage"` uses z(R) + β z(u) per role instead. Roles outside
  [0, num_roles) take no part.

  Paper: "IterSynth: Rethinking Deep Search Agents via Role-Decoupled Iterative Synthesis"
  (RDPO, arXiv preprint). The abstract describes role-decoupled optimisation; the form
  above and β = 1 are this library's.

  Args:
    reward: [B] terminal outcome R.
    step_reward: [B,K] turn-level rubric score u.
    step_mask: [B,K] bool, turns that took place.
    turn_role: [B,K] int role of each turn (0 planner, 1 synthesiser).
    turn_id: [B,T] int turn of each token, −1 outside turns.
    group_id: [B] int prompt group.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups.
    num_roles: static number of roles.
    beta: rubric weight β.
    combine: static, "reward" | "advantage".
    eps: added to the std.

  Returns:
    [B,T] float32; each policy token of turn k gets a[b,k], 0 elsewhere.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = rdpo_advantages(reward=np.array([1., 0.]), step_reward=np.array([[.5, 1.],
    ...     [0., .5]]), turn_role=np.array([[0, 1], [0, 1]]), step_mask=np.ones((2, 2), bool),
    ...     turn_id=tid, group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool),
    ...     num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.7071, 0.7071, 0.7071, 0.7071], [-0.7071, -0.7071, -0.7071, -0.7071]]
  """
  check_choice("rdpo_advantages", "combine", combine, COMBINE)
  check_int("rdpo_advantages", "num_roles", num_roles)
  rows = ops.group_rows("rdpo_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  u_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  role_BK = jnp.asarray(turn_role, jnp.int32)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([u_BK, valid_BK, role_BK])
  chex.assert_equal_shape([tid, rows.mask])
  R_BK = jnp.broadcast_to(rows.values[:, None], u_BK.shape)
  norm = lambda x: ops.turn_normalize(x, valid_BK, rows.group_id, num_groups, by="key",
                                      key=role_BK, num_keys=num_roles, ddof=1, eps=eps)
  if combine == "reward":
    adv_BK = norm(R_BK + beta * jnp.where(valid_BK, u_BK, 0.0))
  else:
    adv_BK = norm(R_BK) + beta * norm(u_BK)
  return ops.turn_broadcast(adv_BK, tid, rows.mask)
