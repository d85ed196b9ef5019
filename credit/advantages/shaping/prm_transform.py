"""Clip / Delta transforms of PRM step rewards (Gao et al.), placed at step ends, then returns."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["prm_step_transform", "prm_transform_advantages"]

_PAPER = ("On Designing Effective RL Reward at Training Time for LLM Reasoning (Gao et al.), "
          "arXiv 2410.15115")
_TRANSFORMS = ("clip", "delta", "clip_delta", "none")


def prm_step_transform(step_reward: ArrayLike, step_mask: ArrayLike, *,
                       transform: str = "clip_delta", eta: ArrayLike = 0.5) -> Array:
  """The Clip / Delta transforms of PRM step scores p [B,K] over the valid steps.

  ::

    clip:        r̃_s = min(p_s − η, 0)
    delta:       r̃_s = p_s − p_{s'}  (s' the next valid step),   r̃_last = p_last
    clip_delta:  delta applied to the clipped scores;              none: r̃ = p

  Delta telescopes: the return from any step is that step's score alone, so a policy
  cannot collect reward by adding steps. Returns [B,K] float32, 0 outside `step_mask`.
  """
  check_choice("prm_step_transform", "transform", transform, _TRANSFORMS)
  p = jnp.asarray(step_reward, jnp.float32)
  v = jnp.asarray(step_mask).astype(bool)
  chex.assert_rank([p, v], 2)
  chex.assert_equal_shape([p, v])
  p = jnp.where(v, p, 0.0)
  if transform in ("clip", "clip_delta"):
    p = jnp.where(v, jnp.minimum(p - jnp.asarray(eta, jnp.float32), 0.0), 0.0)
  if transform in ("delta", "clip_delta"):
    p = p - ops.next_valid_value(p, v)
  return jnp.where(v, p, 0.0)


@register_estimator("prm_transform",
                    needs=("reward", "step_reward", "step_mask", "step_id", "response_mask"),
                    paper=_PAPER, optional_needs={"group_id": "group_baseline"},
                    static_argnames=("num_groups", "transform", "group_baseline"),
                    confidence="inferred",
                    source=_PAPER + ", its Clip and Delta mechanisms as the paper describes them")
def prm_transform_advantages(*, reward: ArrayLike, step_reward: ArrayLike,
                             step_mask: ArrayLike, step_id: ArrayLike,
                             response_mask: ArrayLike, group_id: ArrayLike | None = None,
                             num_groups: int | None = None,
                             transform: Literal["clip", "delta", "clip_delta", "none"] =
                             "clip_delta", eta: ArrayLike = 0.5, alpha: ArrayLike = 1.0,
                             gamma: ArrayLike = 1.0,
                             group_baseline: bool = False) -> Array:
  """Clip / Delta-transformed PRM rewards at step ends plus the success reward, as returns.

  Dense PRM rewards invite reward hacking (more steps, more reward); Clip bounds every step
  reward above by 0 and Delta makes the return from any step one score::

    r̃       = prm_step_transform(p, transform, η)                 (per valid step)
    x[i,t]  = α r̃_{i,s} at the last token of step s, + R_i at the last response token
    A[i,t]  = Σ_{t' ≥ t} γ^{n(t,t')} x[i,t']                      (returns-to-go)
    group_baseline:  A[i,t] −= mean over the group's rows of their whole-response return

  Paper: "On Designing Effective RL Reward at Training Time for LLM Reasoning",
  arXiv 2410.15115. The paper trains with PPO and a critic; without one the returns are
  REINFORCE advantages (`group_baseline=False`), and `group_baseline=True` is this library's
  option. Steps without tokens add nothing; tokens outside any step still carry the return.

  Args:
    reward: [B] success reward R (1/0 or ±1).
    step_reward: [B,K] PRM scores p.
    step_mask: [B,K] bool valid steps.
    step_id: [B,T] int step of each token (−1 outside).
    response_mask: [B,T] bool.
    group_id: [B] int group ids (`group_baseline` only).
    num_groups: static number of groups (`group_baseline` only).
    transform: static, "clip" | "delta" | "clip_delta" | "none".
    eta: Clip threshold η.
    alpha: process-reward weight α.
    gamma: discount γ.
    group_baseline: static, see above.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = prm_transform_advantages(
    ...     reward=np.array([1., 0.]), step_reward=np.array([[.9, .8], [.3, .6]]),
    ...     step_mask=np.ones((2, 2), bool), step_id=np.array([[0, 0, 1, 1]] * 2, np.int32),
    ...     response_mask=np.ones((2, 4), bool))
    >>> np.round(np.asarray(a, np.float64), 4).tolist()   # clip_delta, η = 0.5
    [[1.0, 1.0, 1.0, 1.0], [-0.2, -0.2, 0.0, 0.0]]
  """
  fn = "prm_transform_advantages"
  check_choice(fn, "transform", transform, _TRANSFORMS)
  r_B = jnp.asarray(reward, jnp.float32)
  m_BT = jnp.asarray(response_mask).astype(bool)
  sid = jnp.asarray(step_id)
  chex.assert_rank([r_B, m_BT, sid], [1, 2, 2])
  chex.assert_type(sid, int)
  chex.assert_equal_shape([m_BT, sid])
  chex.assert_equal_shape_prefix([r_B, m_BT], 1)
  rt_BK = prm_step_transform(step_reward, step_mask, transform=transform, eta=eta)
  K = rt_BK.shape[1]
  sid = sid.astype(jnp.int32)
  ends = ops.turn_edges(sid, m_BT, K, last=True)
  ends = ends & jnp.take_along_axis(jnp.asarray(step_mask).astype(bool),
                                    jnp.clip(sid, 0, K - 1), axis=1)
  x_BT = jnp.where(ends, jnp.asarray(alpha, jnp.float32) * ops.turn_broadcast(rt_BK, sid, m_BT),
                   0.0)
  x_BT = x_BT + ops.outcome_to_token_rewards(r_B, m_BT)
  g_BT = ops.discounted_reverse_cumsum(x_BT, m_BT, gamma)
  if not group_baseline:
    return g_BT
  if group_id is None or num_groups is None:
    raise ValueError(f"{fn}: group_baseline=True needs group_id and num_groups")
  valid_B = jnp.any(m_BT, axis=-1)
  first = m_BT & (jnp.cumsum(m_BT, axis=-1) == 1)
  g0_B = jnp.sum(jnp.where(first, g_BT, 0.0), axis=-1)
  gid_B = jnp.asarray(group_id, jnp.int32)
  chex.assert_shape(gid_B, r_B.shape)
  valid_B = valid_B & (gid_B >= 0) & (gid_B < num_groups)
  mom = ops.group_moments_rows(g0_B, gid_B, valid_B, num_groups, None)
  return jnp.where(m_BT & valid_B[:, None], g_BT - mom.mean[:, None], 0.0)
