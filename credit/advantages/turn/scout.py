"""SCOUT UPS-GRPO: outcome z-score + per-turn alignment z-score; uncertainty priorities."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["scout_advantages", "scout_priorities", "ScoutPriorities"]

_PAPER = ("SCOUT: Self-Checking and Recovery-Aware Tool-Thought Agents for Ultra-Long "
          "Egocentric Video Reasoning (UPS-GRPO), arXiv preprint")


@register_estimator("scout", needs=("reward", "step_reward", "step_mask", "turn_id", "group_id",
                                    "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def scout_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                     turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                     num_groups: int, beta: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """SCOUT turn-level advantage: the outcome's z-score plus the turn's tool-alignment z-score.

  ::

    a[b,k] = z_g(R)_b + β z_{(g,k)}(v)[b,k]

  with v = `step_reward` the tool-grounded alignment reward of turn k (e.g. the temporal
  IoU of the inspected video segment), z_g the outcome's group z-score and z_{(g,k)} the
  z-score over the group's rows that took turn k (unbiased std + eps; fewer than two items
  give 0). Leave turns without a tool call out of `step_mask`. Policy tokens outside any
  turn get the outcome part only. `scout_priorities` scores where to re-roll.

  Paper: "SCOUT: Self-Checking and Recovery-Aware Tool-Thought Agents for Ultra-Long
  Egocentric Video Reasoning" (UPS-GRPO, arXiv preprint). The decomposition above and
  β = 1 are this library's reading of the abstract.

  Args:
    reward: [B] outcome.
    step_reward: [B,K] alignment reward.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    beta: weight β of the alignment part.
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = scout_advantages(reward=np.array([1., 0.]), step_reward=np.array([[.8, .6],
    ...     [.2, .6]]), step_mask=np.ones((2, 2), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.4142, 1.4142, 0.7071, 0.7071], [-1.4142, -1.4142, -0.7071, -0.7071]]
  """
  rows = ops.group_rows("scout_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  v_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([v_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  out_B = ops.turn_normalize(rows.values[:, None], rows.valid[:, None], rows.group_id,
                             num_groups, ddof=1, eps=eps)[:, 0]
  turn_BK = ops.turn_normalize(v_BK, valid_BK, rows.group_id, num_groups, by="index", ddof=1,
                               eps=eps)
  adv_BT = ops.broadcast_to_tokens(out_B, rows.mask) + beta * ops.turn_broadcast(
      turn_BK, tid, rows.mask)
  return jnp.where(rows.mask, adv_BT, 0.0)


class ScoutPriorities(NamedTuple):
  """Uncertainty of each post-tool state and the top-m of them.

  Attributes:
    priority: [B,K] u_{b,k}, mean entropy of the policy tokens of the next valid turn
      after turn k (−inf where turn k has no later valid turn or the row is empty).
    index: [m] int32 flat indices b·K + k of the m highest priorities (ties: lower index
      first).
    valid: [m] bool, False where fewer than m states have a finite priority.
  """
  priority: Array
  index: Array
  valid: Array


def scout_priorities(*, entropy: ArrayLike, turn_id: ArrayLike, step_mask: ArrayLike,
                     response_mask: ArrayLike, num_branch: int = 4) -> ScoutPriorities:
  """UPS-GRPO branching priorities (the sampler decides where to re-roll; this scores states).

  The state after the tool observation of turn k is scored by the mean policy entropy over
  the response of the following turn, so exploration concentrates on high-uncertainty
  post-tool states::

    u[b,k] = mean over t with turn_id = k⁺ of H[b,t],   k⁺ = next valid turn after k

  Args:
    entropy: [B,T] per-token policy entropy.
    turn_id: [B,T] int (−1 outside turns).
    step_mask: [B,K] bool, turns that took place.
    response_mask: [B,T] bool policy tokens.
    num_branch: static m, how many states to return.

  Returns:
    `ScoutPriorities`.
  """
  check_int("scout_priorities", "num_branch", num_branch)
  mask_BT = jnp.asarray(response_mask, bool)
  valid_BK = jnp.asarray(step_mask, bool) & jnp.any(mask_BT, axis=1)[:, None]
  B, K = valid_BK.shape
  h_BK = ops.turn_reduce(entropy, turn_id, K, mask=mask_BT, reduce="mean")
  n_BK = ops.turn_reduce(entropy, turn_id, K, mask=mask_BT, reduce="count")
  has_BK = valid_BK & (n_BK > 0)
  # Next valid turn after k: reverse running minimum of the indices of valid turns.
  ks = jnp.arange(K, dtype=jnp.int32)
  idx_BK = jnp.where(has_BK, ks[None, :], K)
  nxt_BK = jax.lax.cummin(idx_BK, axis=1, reverse=True)
  nxt_BK = jnp.concatenate([nxt_BK[:, 1:], jnp.full((B, 1), K, jnp.int32)], axis=1)
  ok_BK = valid_BK & (nxt_BK < K)
  u_BK = jnp.take_along_axis(h_BK, jnp.clip(nxt_BK, 0, K - 1), axis=1)
  u_BK = jnp.where(ok_BK, u_BK, -jnp.inf)
  m = min(num_branch, B * K)
  top, index = jax.lax.top_k(u_BK.reshape(-1), m)
  return ScoutPriorities(priority=u_BK, index=index.astype(jnp.int32),
                         valid=jnp.isfinite(top))
