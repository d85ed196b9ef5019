"""SSPO: step-level self-distilled weights on the GRPO advantage of failed trajectories."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.advantages.distill._steps import clean_logprobs, clip_steps, grpo_rows, step_means
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["sspo_advantages", "sspo_step_weights"]

_PAPER = ("Beyond Outcome Rewards: Step-Level Self-Distilled Policy Optimization (SSPO), "
          "arXiv preprint")


def sspo_step_weights(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                      logprob_teacher: ArrayLike, step_id: ArrayLike, num_steps: int = 16,
                      omega_min: ArrayLike = 0.0, omega_max: ArrayLike = 3.0) -> Array:
  """Mean-1 step weights ω[b,k] = n_b D[b,k] / Σ_j D[b,j], clipped, per token.

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float plain-context log-probs.
    logprob_teacher: [B,T] float privileged-context log-probs.
    step_id: [B,T] int step of each token, −1 outside steps.
    num_steps: static S; step ids ≥ S are merged into step S − 1.
    omega_min: lower clip of ω.
    omega_max: upper clip of ω (`jnp.inf` disables it).

  Returns:
    [B,T] float32 weights ≥ 0 (no gradient); 1 on valid tokens outside every step, 0
    outside the mask.

  Example:
    >>> import numpy as np
    >>> w = sspo_step_weights(response_mask=np.ones((1, 3), bool),
    ...     logprob_old=np.zeros((1, 3)), logprob_teacher=-np.array([[0.1, 0.5, 0.3]]),
    ...     step_id=np.array([[0, 1, 2]], np.int32))
    >>> np.round(np.asarray(w, np.float64), 6).tolist()
    [[0.333333, 1.666667, 1.0]]
  """
  check_int("sspo_step_weights", "num_steps", num_steps)
  mask_BT, ls_BT, lt_BT = clean_logprobs(response_mask, logprob_old, logprob_teacher)
  sid_BT = clip_steps(step_id, mask_BT, num_steps)
  d_BS, count_BS = step_means(jnp.abs(ls_BT - lt_BT), sid_BT, num_steps)
  valid_BS = count_BS > 0
  n_B = jnp.sum(valid_BS, axis=-1).astype(jnp.float32)
  total_B = jnp.sum(jnp.where(valid_BS, d_BS, 0.0), axis=-1)
  ok_B = total_B > 0
  omega_BS = n_B[:, None] * d_BS / jnp.where(ok_B, total_B, 1.0)[:, None]
  omega_BS = jnp.where(ok_B[:, None], omega_BS, 1.0)
  omega_BS = jnp.clip(omega_BS, jnp.asarray(omega_min, jnp.float32),
                      jnp.asarray(omega_max, jnp.float32))
  w_BT = jnp.where(sid_BT >= 0, ops.turn_broadcast(omega_BS, sid_BT), 1.0)
  return jax.lax.stop_gradient(jnp.where(mask_BT, w_BT, 0.0))


@register_estimator(
    "sspo", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher",
                   "step_id"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "num_steps", "group_std"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def sspo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_old: ArrayLike, logprob_teacher: ArrayLike, step_id: ArrayLike,
                    num_groups: int, group_size: int | None = None, num_steps: int = 16,
                    success_threshold: ArrayLike = 1.0, omega_min: ArrayLike = 0.0,
                    omega_max: ArrayLike = 3.0,
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """SSPO: a privileged self-teacher sets how hard each step of a failed rollout is pushed down.

  The outcome keeps its sign; the same model under a privileged context (step-level
  evidence anchors) reweights the steps of incorrect trajectories only::

    D[b,k] = mean_{t ∈ step k} abs(ℓˢ_t − ℓᵀ_t)
    ω[b,k] = clip(n_b D[b,k] / Σ_j D[b,j], ω_min, ω_max)      (n_b: steps with a token)
    A[b,t] = Â_b · (1 if c_b else ω[b,k(t)]),   c_b = [R_b ≥ success_threshold]

  ω ≥ 0 never flips a sign; without clipping its mean over a row's steps is 1. An
  all-failed group has Â = 0 and gets no signal. The output carries no gradient.

  Paper: "Beyond Outcome Rewards: Step-Level Self-Distilled Policy Optimization" (arXiv
  preprint). The abstract gives the idea but no equation: the disagreement D, the clip
  [0, 3] and S = 16 are this library's reading.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float log-prob of the sampled token, plain context.
    logprob_teacher: [B,T] float the same under the privileged context.
    step_id: [B,T] int reasoning step of each token, −1 outside steps.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    num_steps: static S, the most steps per row.
    success_threshold: c_b = R_b ≥ threshold.
    omega_min: lower clip of ω.
    omega_max: upper clip of ω.
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = sspo_advantages(reward=np.array([1.0, 0.0, 0.0]), group_id=np.zeros(3, np.int32),
    ...     response_mask=np.ones((3, 3), bool), logprob_old=np.zeros((3, 3)),
    ...     logprob_teacher=-np.array([[0.1, 0.5, 0.3]] * 3),
    ...     step_id=np.array([[0, 1, 2]] * 3, np.int32), num_groups=1)
    >>> np.round(np.asarray(a[:2], np.float64), 5).tolist()
    [[1.1547, 1.1547, 1.1547], [-0.19245, -0.96225, -0.57735]]
  """
  check_int("sspo_advantages", "num_steps", num_steps)
  rows, adv_B = grpo_rows("sspo_advantages", reward, group_id, response_mask, num_groups,
                          group_size, group_std, eps)
  w_BT = sspo_step_weights(response_mask=rows.mask, logprob_old=logprob_old,
                           logprob_teacher=logprob_teacher, step_id=step_id,
                           num_steps=num_steps, omega_min=omega_min, omega_max=omega_max)
  correct_B = rows.values >= jnp.asarray(success_threshold, jnp.float32)
  w_BT = jnp.where(correct_B[:, None], 1.0, w_BT)
  return jax.lax.stop_gradient(jnp.where(rows.mask, adv_B[:, None] * w_BT, 0.0))
