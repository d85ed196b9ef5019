"""OPID: episode advantage plus skill-augmented re-scoring (hindsight skill teacher terms)."""
from __future__ import annotations

from typing import Literal

import jax
from jax.typing import ArrayLike

from credit.advantages.distill._skills import (OPID_MODES, OPID_SINGLETONS,
                                              opid_gigpo_step_advantages, opid_teacher_term,
                                              skill_advantages)
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["opid_advantages", "opid_teacher_term", "opid_gigpo_step_advantages", "OPID_MODES",
           "OPID_SINGLETONS"]

_PAPER = ("OPID: on-policy distillation of hindsight skills (episode- and step-level) for LLM "
          "agents, arXiv 2606.26790; code https://github.com/jinyangwu/OPID "
          "(gigpo/core_gigpo.py)")


@register_estimator(
    "opid", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_alt"),
    paper=_PAPER,
    optional_needs={"step_reward": "gigpo_step", "state_key": "gigpo_step",
                    "step_mask": "gigpo_step", "turn_id": "gigpo_step"},
    static_argnames=("num_groups", "group_size", "mode", "singleton", "normalize_teacher",
                     "failed_only", "gigpo_step"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: jinyangwu/OPID gigpo/core_gigpo.py "
                            "(episode_norm_reward, compute_teacher_token_advantage, "
                            "compute_opid_advantage_components), "
                            "examples/opid_trainer/run_alfworld_opid_guide.sh"))
def opid_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
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
  """OPID: the episode advantage plus the old policy's log-prob shift under hindsight skills.

  Hindsight skills, natural-language lessons an analyser extracts from finished
  trajectories, are put into the context and the old policy re-scores the same sampled
  response; the shift is a token advantage added to the outcome's::

    Â_b = (R_b − μ_g) / (σ_g + ε)   ("mean_std_norm")     Â_b = R_b − μ_g   ("mean_norm")
    T_e[b,t] = sg(ℓ_ep[b,t] − ℓ_s[b,t]),    T_s[b,t] = sg(ℓ_step[b,t] − ℓ_s[b,t])
    A[b,t] = M[b,t] · (Â_b + w_e T_e[b,t] + w_s T_s[b,t])

  with ℓ_s = `logprob_old`, ℓ_ep = `logprob_alt` (episode skill in context) and ℓ_step =
  `logprob_teacher` (a step-level skill; no step term when None). Pass `logprob_old` itself
  where a row has no skill (T = 0). `gigpo_step` adds GiGPO's anchor-state step term
  (`opid_gigpo_step_advantages`). The output carries no gradient.

  Paper: "OPID: on-policy distillation of hindsight skills for LLM agents",
  arXiv 2606.26790. Defaults are the authors' ALFWorld script's (w_e = w_s = 0.001,
  "mean_std_norm"); a one-trajectory group gets μ = 0, σ = 1 as in the code
  (`singleton="raw"`). The statistics run over the rows of each group (the code's step
  layout with one row per step gives its default).

  Args:
    reward: [B] float episode rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float ℓ_s, the old policy on the sampled tokens.
    logprob_alt: [B,T] float ℓ_ep, the same with the episode skill in the context.
    logprob_teacher: optional [B,T] float ℓ_step, with the step-level skill in the context.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    mode: static, "mean_std_norm" | "mean_norm".
    episode_weight: w_e.
    step_weight: w_s (used only with `logprob_teacher`).
    singleton: static, "raw" | "zero".
    normalize_teacher: static, standardise each teacher term over its active tokens.
    clip_teacher: None or a clip c > 0 of each teacher term (after normalising).
    failed_only: static, teacher terms only on rows with R < τ.
    success_threshold: τ for `failed_only`.
    eps: ε of the normalisations.
    gigpo_step: static, add the GiGPO step term.
    step_reward: [B,K] per-turn rewards (`gigpo_step` only).
    state_key: [B,K] int anchor-state keys (`gigpo_step` only).
    step_mask: [B,K] bool (`gigpo_step` only).
    turn_id: [B,T] int (`gigpo_step` only).
    gigpo_weight: w_g of the step term.
    gigpo_gamma: γ of the step returns.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> lp_old = np.tile(np.array([[-0.7, -1.0]], np.float32), (4, 1))
    >>> lp_ep = lp_old.copy(); lp_ep[1] = [-0.2, -1.5]
    >>> a = opid_advantages(reward=np.array([1., 0., 0., 1.]), group_id=np.zeros(4, np.int32),
    ...                     response_mask=np.ones((4, 2), bool), logprob_old=lp_old,
    ...                     logprob_alt=lp_ep, num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 6).tolist()[:2]
    [[0.866024, 0.866024], [-0.865524, -0.866524]]
  """
  return skill_advantages(
      "opid_advantages", reward=reward, group_id=group_id, response_mask=response_mask,
      logprob_old=logprob_old, logprob_alt=logprob_alt, logprob_teacher=logprob_teacher,
      num_groups=num_groups, group_size=group_size, mode=mode, episode_weight=episode_weight,
      step_weight=step_weight, singleton=singleton, normalize_teacher=normalize_teacher,
      clip_teacher=clip_teacher, failed_only=failed_only, success_threshold=success_threshold,
      eps=eps, gigpo_step=gigpo_step, step_reward=step_reward, state_key=state_key,
      step_mask=step_mask, turn_id=turn_id, gigpo_weight=gigpo_weight, gigpo_gamma=gigpo_gamma)
