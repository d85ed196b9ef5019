"""DAPO: GRPO z-score of the task reward plus the soft overlong penalty.

Registers `dapo`; also holds the two DAPO pieces that are not advantages: the
dynamic-sampling filter `dapo_keep_mask` and the overlong penalty `dapo_overlong_penalty`.
"""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import grpo_scalar
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["dapo_advantages", "dapo_keep_mask", "dapo_overlong_penalty"]

_PAPER = "DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476"


def dapo_overlong_penalty(response_length: ArrayLike, max_length: ArrayLike,
                          cache_length: ArrayLike, penalty_factor: ArrayLike = 1.0) -> Array:
  """DAPO's soft overlong punishment R_len(L) of a response of length L.

  ::

    L_exp = L_max − L_cache
    R_len = 0                            if L ≤ L_exp
          = (L_exp − L) / L_cache · f    if L_exp < L ≤ L_max
          = −f                           if L > L_max

  Paper: "DAPO", arXiv 2503.14476, eq. 13. verl's reward manager computes
  min(−(L − L_exp)/L_cache · f, 0) and never sees L > L_max (responses are truncated);
  the clip at −f follows the paper. Added to the task reward before group normalisation.

  Args:
    response_length: [B] (or any shape) response lengths L.
    max_length: L_max (generation budget).
    cache_length: L_cache (> 0), the soft-punishment buffer.
    penalty_factor: f.

  Returns:
    float32 penalties of the shape of `response_length`, in [−f, 0].

  Example:
    >>> dapo_overlong_penalty(jnp.array([16000, 18432, 20480, 30000]), 20480, 4096).tolist()
    [0.0, -0.5, -1.0, -1.0]
  """
  if isinstance(cache_length, (int, float)) and cache_length <= 0:
    raise ValueError(f"dapo_overlong_penalty: cache_length must be > 0, got {cache_length}")
  if (isinstance(cache_length, (int, float)) and isinstance(max_length, (int, float))
      and cache_length > max_length):
    raise ValueError(f"dapo_overlong_penalty: cache_length={cache_length} exceeds "
                     f"max_length={max_length}")
  length = jnp.asarray(response_length, jnp.float32)
  f = jnp.asarray(penalty_factor, jnp.float32)
  cache = jnp.asarray(cache_length, jnp.float32)
  expected = jnp.asarray(max_length, jnp.float32) - cache
  return jnp.clip(-(length - expected) / cache * f, -f, 0.0)


def dapo_keep_mask(metric: ArrayLike, group_id: ArrayLike | None, num_groups: int,
                   group_size: int | None = None, valid: ArrayLike | None = None) -> Array:
  """DAPO's dynamic-sampling filter as a row mask.

  keep_g = 1[min_{i∈g} m_i < max_{i∈g} m_i]: a group whose metric (accuracy by default)
  is the same for every member, all solved or all failed, is dropped entirely, and so is
  a one-row group. Multiply the result into `response_mask`; refilling the batch until it
  is full is the trainer's job.

  Paper: "DAPO", arXiv 2503.14476, the constraint of eq. 11.

  Args:
    metric: [B] per-row filter metric (e.g. accuracy).
    group_id: [B] int32 group ids (unused with `group_size`).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    valid: optional [B] bool rows to consider (invalid rows are never kept).

  Returns:
    [B] bool keep mask.
  """
  m_B, gid_B, _, ok_B = ops.group_rows("dapo_keep_mask", metric, group_id, num_groups,
                                       group_size, valid=valid)
  gmax = ops.group_reduce_rows(m_B, gid_B, ok_B, num_groups, group_size, "max")
  gmin = ops.group_reduce_rows(m_B, gid_B, ok_B, num_groups, group_size, "min")
  return ok_B & (gmin < gmax)


@register_estimator("dapo", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/workers/reward_manager/dapo.py, docs/algo/dapo.md"))
def dapo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, group_size: int | None = None,
                    max_length: int | None = None, cache_length: int = 4096,
                    penalty_factor: float = 1.0, eps: float = 1e-6,
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """DAPO advantage: GRPO z-score of the task reward plus the soft overlong penalty.

  ::

    R'_i = R_i + R_len(L_i)        (`dapo_overlong_penalty`, when `max_length` is set)
    a_i  = (R'_i − μ_g) / (σ_g + ε),   A[i,t] = a_i · M[i,t]

  with L_i the row's response tokens. DAPO's other parts live elsewhere: clip-higher and
  token-mean aggregation in the loss (`ppo_clip` with `clip_ratio_high`), dynamic
  sampling in `dapo_keep_mask` (multiply it into `response_mask`; dropped rows then take
  no part in the statistics here).

  Paper: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv 2503.14476, §3.4 and eq. 13; the paper's settings are L_max = 20480,
  L_cache = 4096, f = 1.

  Args:
    reward: [B] float task rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    max_length: L_max; None disables the overlong penalty.
    cache_length: L_cache.
    penalty_factor: f.
    eps: added to the std.
    singleton: "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> m = np.array([[1, 1, 1, 1]] * 3 + [[1, 1, 1, 0]], bool)   # L_exp = 2: −1, −1, −1, −0.5
    >>> a = dapo_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
    ...                     response_mask=m, num_groups=1, max_length=4, cache_length=2)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [0.5, -0.8333, -0.8333, 1.1667]
  """
  check_choice("dapo_advantages", "singleton", singleton, ops.SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "dapo_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  if max_length is not None:
    reward_B = reward_B + dapo_overlong_penalty(ops.sequence_lengths(mask_BT), max_length,
                                                cache_length, penalty_factor)
  adv_B = grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, "group", eps, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
