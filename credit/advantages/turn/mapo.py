"""MAPO: mixed (turn-index + batch) normalisation of Monte-Carlo returns of judge turn scores."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["mapo_advantages"]

_PAPER = ("MAPO: Mixed Advantage Policy Optimization for Long-Horizon Multi-Turn Dialogue, "
          "arXiv 2603.06194")


@register_estimator("mapo", needs=("step_reward", "step_mask", "turn_id", "group_id",
                                   "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    optional_needs=(("reward", "outcome_coef"),),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def mapo_advantages(*, step_reward: ArrayLike, step_mask: ArrayLike, turn_id: ArrayLike,
                    group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                    reward: ArrayLike | None = None, outcome_coef: ArrayLike = 0.0,
                    gamma: ArrayLike = 1.0, lam: ArrayLike = 0.5, eps: float = 1e-6) -> Array:
  """MAPO mixed advantage over turn returns: per-turn-index and batch z-scores, mixed.

  A judge scores every dialogue turn; the Monte-Carlo returns of those scores are z-scored
  among the group's rows at the same turn index and over the whole batch, then mixed::

    r[b,k] = s[b,k] + c R_b [k = last valid turn of b]
    G[b,k] = Σ_{k' ≥ k} γ^{n(k,k')} r[b,k']                (over valid turns)
    A_turn[b,k]  = z-score of G over the rows of b's group that took turn k
    A_batch[b,k] = z-score of G over every valid (b, k) cell of the batch
    a[b,k] = λ A_turn + (1 − λ) A_batch

  Unbiased std plus `eps`; cells with fewer than two members get 0 in the turn part.
  Invalid rows and turns outside `step_mask` take part in no statistic.

  Paper: "MAPO: Mixed Advantage Policy Optimization for Long-Horizon Multi-Turn
  Dialogue", arXiv 2603.06194. The abstract describes the mixed normalisation; the exact
  form and λ = 0.5 are this library's reading. When turns are many and uniform, the batch
  part z-scores returns that count the steps left (see the method's page).

  Args:
    step_reward: [B,K] judge score of each turn.
    step_mask: [B,K] bool, turns that took place.
    turn_id: [B,T] int, turn of each token (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups.
    reward: optional [B] outcome, used when `outcome_coef` ≠ 0.
    outcome_coef: weight c of the outcome added to the last turn (0: off).
    gamma: turn discount γ.
    lam: mixing weight λ of the per-turn-index part.
    eps: added to the std.

  Returns:
    [B,T] float32 advantages, 0 outside `response_mask` and outside turns.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 1, 2], [0, 1, 2]])
    >>> a = mapo_advantages(step_reward=np.array([[.2, .5, 1.], [.4, .1, 0.]]),
    ...     step_mask=np.ones((2, 3), bool), turn_id=tid, group_id=np.array([0, 0]),
    ...     response_mask=np.ones((2, 3), bool), num_groups=1)
    >>> [round(float(v), 4) for v in a[0]]
    [0.9824, 0.8427, 0.4933]
  """
  mask_BT = jnp.asarray(response_mask, bool)
  chex.assert_rank(mask_BT, 2)
  rows = ops.group_rows("mapo_advantages", jnp.zeros(mask_BT.shape[:1]), group_id, num_groups,
                        response_mask=mask_BT)
  x_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([x_BK, valid_BK])
  chex.assert_equal_shape([tid, mask_BT])
  x_BK = jnp.where(valid_BK, x_BK, 0.0)
  if reward is not None:
    reward_B = jnp.asarray(reward, jnp.float32)
    chex.assert_shape(reward_B, mask_BT.shape[:1])
    last_BK = valid_BK & (ops.turn_counts(valid_BK) == 1.0)
    x_BK = x_BK + outcome_coef * jnp.where(last_BK, reward_B[:, None], 0.0)
  ret_BK = ops.turn_returns(x_BK, valid_BK, gamma)
  turn_BK = ops.turn_normalize(ret_BK, valid_BK, rows.group_id, num_groups, by="index",
                               ddof=1, eps=eps)
  batch_BK = ops.turn_normalize(ret_BK, valid_BK, jnp.zeros_like(rows.group_id), 1,
                                by="pooled", ddof=1, eps=eps)
  adv_BK = lam * turn_BK + (1.0 - lam) * batch_BK
  return ops.turn_broadcast(jnp.where(valid_BK, adv_BK, 0.0), tid, mask_BT)
