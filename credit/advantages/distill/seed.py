"""SEED: OPID's skill-augmented re-scoring advantage with self-generated skills."""
from __future__ import annotations

from typing import Literal

import jax
from jax.typing import ArrayLike

from credit.advantages.distill._skills import skill_advantages
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["seed_advantages"]

_PAPER = ("SEED: self-evolving agents that distil their own hindsight skills, arXiv preprint "
          "(authors' code: https://github.com/jinyangwu/SEED)")


@register_estimator(
    "seed", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_alt"),
    paper=_PAPER,
    optional_needs={"step_reward": "gigpo_step", "state_key": "gigpo_step",
                    "step_mask": "gigpo_step", "turn_id": "gigpo_step"},
    static_argnames=("num_groups", "group_size", "mode", "singleton", "normalize_teacher",
                     "failed_only", "gigpo_step"),
                    confidence="inferred",
                    source=_PAPER + ", abstract; the estimator is OPID's (see opid)")
def seed_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_old: ArrayLike, logprob_alt: ArrayLike,
                    logprob_teacher: ArrayLike | None = None, num_groups: int,
                    group_size: int | None = None,
                    mode: Literal["mean_std_norm", "mean_norm"] = "mean_std_norm",
                    episode_weight: ArrayLike = 0.001, step_weight: ArrayLike = 0.001,
                    singleton: Literal["raw", "zero"] = "raw",
                    normalize_teacher: bool = False, clip_teacher: ArrayLike | None = None,
                    failed_only: bool = False, success_threshold: ArrayLike = 1.0,
                    eps: ArrayLike = 1e-6, gigpo_step: bool = False,
                    step_reward: ArrayLike | None = None, state_key: ArrayLike | None = None,
                    step_mask: ArrayLike | None = None, turn_id: ArrayLike | None = None,
                    gigpo_weight: ArrayLike = 1.0, gigpo_gamma: ArrayLike = 0.95) -> Array:
  """SEED: the episode advantage plus the old policy's log-prob shift under a self-made skill.

  SEED's policy writes its own hindsight skills (natural-language lessons from its
  finished trajectories); the old policy re-scores the same sampled response with the skill
  in its context, and the log-prob shift is added to the outcome advantage::

    A[b,t] = M[b,t] · (Â_b + w_e · sg(ℓ^skill[b,t] − ℓˢ[b,t]) [+ w_s · sg(ℓ^step[b,t] − ℓˢ[b,t])])

  That is OPID's estimator; only who writes the skill differs (the policy itself rather
  than an external analyser), which changes the loop, not the arrays. So this calls
  `opid_advantages` with the same arguments and defaults; see there for the layout and the
  skill-mask convention (no skill on a row: pass `logprob_old` in that field).

  Paper: "SEED: self-evolving agents that distil their own hindsight skills" (arXiv
  preprint). The abstract describes the mechanism; the equations and defaults are those
  of the same authors' OPID code, since SEED's own weights are not stated.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool.
    logprob_old: [B,T] float old-policy log-probs of the sampled tokens.
    logprob_alt: [B,T] float the same with the self-generated (episode) skill in context.

  The other arguments (`logprob_teacher`, `num_groups`, `group_size`, `mode`,
  `episode_weight`, `step_weight`, `singleton`, `normalize_teacher`, `clip_teacher`,
  `failed_only`, `success_threshold`, `eps`, `gigpo_step`, `step_reward`, `state_key`,
  `step_mask`, `turn_id`, `gigpo_weight`, `gigpo_gamma`) are as in `opid_advantages`: an
  optional step-level skill, the weights, the GiGPO step term.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> lp_old = np.tile(np.array([[-0.7, -1.0]], np.float32), (4, 1))
    >>> lp_skill = lp_old.copy(); lp_skill[1] = [-0.2, -1.5]
    >>> a = seed_advantages(reward=np.array([1., 0., 0., 1.]), group_id=np.zeros(4, np.int32),
    ...                     response_mask=np.ones((4, 2), bool), logprob_old=lp_old,
    ...                     logprob_alt=lp_skill, num_groups=1)
    >>> np.round(np.asarray(a[1], np.float64), 6).tolist()
    [-0.865524, -0.866524]
  """
  return skill_advantages(
      "seed_advantages", reward=reward, group_id=group_id, response_mask=response_mask,
      logprob_old=logprob_old, logprob_alt=logprob_alt, logprob_teacher=logprob_teacher,
      num_groups=num_groups, group_size=group_size, mode=mode, episode_weight=episode_weight,
      step_weight=step_weight, singleton=singleton, normalize_teacher=normalize_teacher,
      clip_teacher=clip_teacher, failed_only=failed_only, success_threshold=success_threshold,
      eps=eps, gigpo_step=gigpo_step, step_reward=step_reward, state_key=state_key,
      step_mask=step_mask, turn_id=turn_id, gigpo_weight=gigpo_weight, gigpo_gamma=gigpo_gamma)
