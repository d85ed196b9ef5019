"""SALT: step advantages from a per-prompt trajectory graph (merge identical steps, average)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["salt_advantages", "salt_step_advantages"]

_PAPER = ("SALT: Step-level Advantage Assignment for Long-horizon Agents via Trajectory Graph, "
          "arXiv 2510.20022")


def salt_step_advantages(adv_B: ArrayLike, step_key: ArrayLike, valid_BK: ArrayLike,
                         group_id: ArrayLike) -> Array:
  """Â[b,s]: the mean of A_{b'} over the trajectories b' of b's group that contain step key[b,s].

  Each trajectory counts once however often it repeats the step. Returns [B,K] float32, 0 at
  invalid steps. O((B·K)²) comparisons (a [B,K,B,K] equality, reduced over the last axis).
  """
  adv = jnp.asarray(adv_B, jnp.float32)
  key = jnp.asarray(step_key)
  valid = jnp.asarray(valid_BK, bool)
  gid = jnp.asarray(group_id, jnp.int32)
  chex.assert_rank([adv, key, valid, gid], [1, 2, 2, 1])
  chex.assert_equal_shape([key, valid])
  same = (key[:, :, None, None] == key[None, None, :, :]) & valid[None, None, :, :]
  inc = jnp.any(same, axis=-1) & (gid[:, None, None] == gid[None, None, :])   # [b, s, b']
  incf = inc.astype(jnp.float32)
  num = jnp.einsum("bsc,c->bs", incf, adv)
  den = jnp.sum(incf, axis=-1)
  return jnp.where(valid & (den > 0), num / jnp.maximum(den, 1.0), 0.0)


@register_estimator(
    "salt", needs=("reward", "group_id", "response_mask", "step_key", "step_mask", "step_id"),
    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def salt_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    step_key: ArrayLike, step_mask: ArrayLike, step_id: ArrayLike,
                    num_groups: int, eps: float = 1e-6) -> Array:
  """SALT: GRPO advantages averaged over the trajectories sharing each step.

  The trajectories of a prompt form a graph whose nodes are steps (identical steps merged):
  a step every trajectory takes is neutral, a step unique to one trajectory is decisive::

    A_b = (r_b − μ_g) / (σ_g + ε)                        (GRPO, unbiased σ)
    inc[b,s,b'] = same group, and b' has a valid step with key[b,s]
    Â[b,s] = Σ_{b'} inc · A_{b'} / Σ_{b'} inc,    A[b,t] = Â[b, step_id[b,t]]

  Each trajectory counts once per node even if it repeats the step. The loop hashes the
  state before a step and its text into `step_key` (hash into 31 bits: keys are compared as
  int32 under JAX's default). Steps outside `step_mask`, empty rows and tokens outside every
  step get 0. Cost: O((B·K)²) comparisons.

  Paper: "SALT: Step-level Advantage Assignment for Long-horizon Agents via Trajectory
  Graph", arXiv 2510.20022. The merge-and-average rule is this library's reading of the
  abstract.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int prompt group in [0, num_groups).
    response_mask: [B,T] bool policy tokens.
    step_key: [B,K] int content key of each step (equal = the same step).
    step_mask: [B,K] bool, the steps that exist.
    step_id: [B,T] int step of each token, −1 outside.
    num_groups: static number of groups.
    eps: ε on the GRPO std.

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> sid = np.array([[0, 1, 2]] * 3, np.int32)
    >>> a = salt_advantages(reward=np.array([1., 0, 0]), group_id=np.zeros(3, np.int32),
    ...     response_mask=sid >= 0, step_key=np.array([[10, 20, 30], [10, 21, 31], [10, 20, 32]]),
    ...     step_mask=np.ones((3, 3), bool), step_id=sid, num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.0, 0.2887, 1.1547], [0.0, -0.5773, -0.5773], [0.0, 0.2887, -0.5773]]
  """
  rows = ops.group_rows("salt_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  sid = jnp.asarray(step_id, jnp.int32)
  step = jnp.asarray(step_mask).astype(bool)
  chex.assert_rank([sid, step], 2)
  chex.assert_equal_shape([sid, rows.mask])
  chex.assert_equal_shape_prefix([step, rows.mask], 1)
  adv = ops.group_normalize(rows.values, rows.group_id, num_groups, valid=rows.valid, eps=eps)
  valid = step & rows.valid[:, None]
  gid = jnp.where(rows.valid, rows.group_id, -1)
  a_BK = salt_step_advantages(adv, step_key, valid, gid)
  return jax.lax.stop_gradient(ops.turn_broadcast(a_BK, sid, rows.mask))
