"""ABSeeker (ABC): clue-anchored step scores as GRPO turn rewards (ABC-GRPO) and SFT weights."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["abseeker_advantages", "abseeker_sft_weights"]

_PAPER = ("ABSeeker: Training Long-Horizon Search Agents via Answer-Backtracked Credit "
          "Assignment, arXiv preprint")


@register_estimator("abseeker", needs=("reward", "step_reward", "step_mask", "turn_id",
                                       "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def abseeker_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                        turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                        num_groups: int, outcome_coef: ArrayLike = 1.0,
                        eps: float = 1e-6) -> Array:
  """ABC-GRPO: clue-anchored step scores (plus the outcome on the last step) as group-normalised rewards.

  A judge compares each search step with clues recovered backward from the gold answer;
  the step score c in [0, 1] (`step_reward`) is the step's reward, and the outcome is
  added to the last step::

    ρ[b,k] = c[b,k] + w · R_b · [k = last valid turn of b]
    A[b,k] = (ρ[b,k] − μ_g^ρ) / (σ_g^ρ + eps)

  pooled over every valid turn of every row of the prompt group (unbiased std; fewer than
  two turns give 0). Useful steps of failed trajectories keep positive credit.

  Paper: "ABSeeker: Training Long-Horizon Search Agents via Answer-Backtracked Credit
  Assignment" (arXiv preprint). The abstract gives the idea but no equation: the formula
  is this library's reading; it assumes the last step is the answer.

  Args:
    reward: [B] outcome R.
    step_reward: [B,K] step score c.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    outcome_coef: weight w of the outcome added to the last step.
    eps: added to the std.

  Returns:
    [B,T] float32; tokens of turn k get A[b,k], 0 elsewhere.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = abseeker_advantages(reward=np.array([1., 0.]), step_reward=np.array([[1., .5],
    ...     [.5, 0.]]), step_mask=np.ones((2, 2), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()   # ρ = [[1, 1.5], [.5, 0]]
    [[0.3873, 0.3873, 1.1619, 1.1619], [-0.3873, -0.3873, -1.1619, -1.1619]]
  """
  rows = ops.group_rows("abseeker_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  c_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([c_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  last_BK = valid_BK & (ops.turn_counts(valid_BK) == 1.0)
  rho_BK = jnp.where(valid_BK, c_BK, 0.0) + outcome_coef * jnp.where(
      last_BK, rows.values[:, None], 0.0)
  adv_BK = ops.turn_normalize(rho_BK, valid_BK, rows.group_id, num_groups, ddof=1, eps=eps)
  return ops.turn_broadcast(adv_BK, tid, rows.mask)


def abseeker_sft_weights(*, step_reward: ArrayLike, step_mask: ArrayLike, turn_id: ArrayLike,
                         response_mask: ArrayLike) -> Array:
  """ABC-SFT per-token NLL weights: each turn's score over the row's mean score (mean 1).

  w[b,k] = c[b,k] / mean_k c[b,k]. A row whose valid scores are all 0 (or that has no
  valid turn) gets weight 1 on every policy token (plain SFT); policy tokens outside any
  turn also get 1.

  Args:
    step_reward: [B,K] step scores c ≥ 0.
    step_mask: [B,K] bool.
    turn_id: [B,T] int.
    response_mask: [B,T] bool.

  Returns:
    [B,T] float32 weights, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> w = abseeker_sft_weights(step_reward=np.array([[1., 0., .5]]),
    ...     step_mask=np.ones((1, 3), bool), turn_id=np.array([[0, 1, 2]]),
    ...     response_mask=np.ones((1, 3), bool))
    >>> [round(float(v), 4) for v in w[0]]
    [2.0, 0.0, 1.0]
  """
  mask_BT = jnp.asarray(response_mask, bool)
  c_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & jnp.any(mask_BT, axis=1)[:, None]
  chex.assert_equal_shape([c_BK, valid_BK])
  c_BK = jnp.where(valid_BK, c_BK, 0.0)
  n_B = jnp.sum(valid_BK, axis=1).astype(jnp.float32)
  mean_B = jnp.sum(c_BK, axis=1) / jnp.maximum(n_B, 1.0)
  ok_B = mean_B > 0
  w_BK = jnp.where(ok_B[:, None], c_BK / jnp.where(ok_B, mean_B, 1.0)[:, None], 1.0)
  tid = jnp.asarray(turn_id, jnp.int32)
  in_turn = (tid >= 0) & (tid < c_BK.shape[1])
  w_BT = jnp.where(in_turn, ops.turn_broadcast(w_BK, tid), 1.0)
  return jnp.where(mask_BT, w_BT, 0.0)
