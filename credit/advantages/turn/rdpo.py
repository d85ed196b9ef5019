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
          "(RDPO; seed abstract, no arXiv id in the seed), "
          "https://huggingface.co/papers?q=IterSynth")

COMBINE = ("reward", "advantage")


@register_estimator("rdpo", needs=("reward", "step_reward", "step_mask", "turn_role", "turn_id",
                                   "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "num_roles", "combine"))
def rdpo_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                    turn_role: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, num_roles: int = 2,
                    beta: ArrayLike = 1.0, combine: Literal["reward", "advantage"] = "reward",
                    eps: float = 1e-6) -> Array:
  """Role-Decoupled Policy Optimization (RDPO) advantage.

  Confidence: inferred (seed abstract; spec outcome_and_clipping.md §21, whose worked example
  is reproduced).

  .. math::
    r_{b,k} = R_b + β·u_{b,k}                       (u = turn rubric score, `step_reward`)
    a_{b,k} = (r_{b,k} − μ_{g,ρ}) / (σ_{g,ρ} + eps),   ρ = turn_role[b,k]

  μ, σ (unbiased) pool every valid turn that role ρ played in the group g (several turns of
  one row count separately); a (group, role) pool with one turn gives 0. `combine="advantage"`
  is the spec's variant: role-wise z-score of the outcome (over the role's turns) plus β times
  the role-wise z-score of the rubric. Roles outside [0, num_roles) take no part (0).

  Args:
    reward: [B] terminal outcome R.
    step_reward: [B,K] turn-level rubric score u.
    step_mask: [B,K] bool, turns that took place.
    turn_role: [B,K] int role of each turn (0 planner, 1 synthesiser).
    turn_id: [B,T] int turn of each token, −1 outside turns.
    group_id: [B] prompt group; num_groups: static number of groups.
    response_mask: [B,T] bool policy tokens.
    num_roles: static number of roles (2).
    beta: rubric weight β (1, unknown in the paper).
    combine: "reward" (normalise R + β·u) or "advantage" (z(R) + β·z(u), per role).
    eps: added to the std.

  Returns:
    [B,T] float32, each policy token of turn k gets a_{b,k}; 0 elsewhere.
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
