"""Memory-R2 LoGo-GRPO: local groups (re-rollouts from one saved state) + global groups."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["logo_advantages"]

_PAPER = ("Memory-R2: Fair Credit Assignment for Long-Horizon Memory-Augmented LLM Agents "
          "(LoGo-GRPO), arXiv 2605.21768, https://github.com/ahmedehabb/Memory-R2")


@register_estimator("logo", needs=("reward", "group_id", "parent_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=(_PAPER + ", abstract; the local-group rule as in code: "
                            "ahmedehabb/Memory-R2 src/verl/verl/rema_trainer/ppo/core_algos.py "
                            "(compute_tree_grpo_outcome_advantage)"))
def logo_advantages(*, reward: ArrayLike, group_id: ArrayLike, parent_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, local_coef: ArrayLike = 1.0,
                    eps: float = 1e-6) -> Array:
  """LoGo-GRPO advantage: global GRPO over full trajectories, local GRPO over re-rollouts.

  Memory-R2 re-rolls trajectories from saved intermediate memory states; rows re-rolled from
  the same state form a local group, full trajectories the global one::

    a_i = (R_i − μ_g(i)) / (σ_g(i) + eps)          if parent_id_i = −1 (a full trajectory)
    a_i = λ (R_i − μ_p(i)) / (σ_p(i) + eps)        if parent_id_i = p ≥ 0 (a re-rollout)

  μ_g, σ_g (unbiased) pool the roots of prompt group g only; μ_p, σ_p the rows sharing the
  parent id p. Groups with one valid member give 0. Equivalent to the paper's
  L(a_glob) + λ L(a_loc) when each row carries one of the two advantages.

  Paper: "Memory-R2: Fair Credit Assignment for Long-Horizon Memory-Augmented LLM Agents"
  (LoGo-GRPO), arXiv 2605.21768. The local rule (siblings of one parent normalised
  together, a parent with one child giving 0) follows the authors' code; λ = 1.

  Args:
    reward: [B] outcome.
    group_id: [B] int prompt group.
    parent_id: [B] int, −1 for a full trajectory, else the id (in [0, B)) of the saved
      state the row was re-rolled from; ids ≥ B take no part.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    local_coef: λ.
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = logo_advantages(reward=np.array([1., 0., 1., 0.]), group_id=np.zeros(4, np.int32),
    ...                     parent_id=np.array([-1, -1, 0, 0]),
    ...                     response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [0.7071, -0.7071, 0.7071, -0.7071]
  """
  rows = ops.group_rows("logo_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  par_B = jnp.asarray(parent_id, jnp.int32)
  chex.assert_equal_shape([par_B, rows.values])
  B = par_B.shape[0]
  mask_BT = jnp.asarray(response_mask, bool)
  row_ok = jnp.any(mask_BT, axis=1)
  is_root = par_B < 0
  glob = ops.group_normalize(rows.values, rows.group_id, num_groups, valid=rows.valid & is_root,
                             eps=eps)
  loc = ops.group_normalize(rows.values, par_B, B, valid=row_ok & ~is_root, eps=eps)
  adv_B = jnp.where(is_root, glob, local_coef * loc)
  return ops.broadcast_to_tokens(adv_B, mask_BT)
