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
                     "failed_only", "gigpo_step"))
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
  """OPID: episode advantage + w_e·(ℓ_ep − ℓˢ) (+ w_s·(ℓ_step − ℓˢ)) on the sampled tokens.

  Confidence: code-verified against jinyangwu/OPID, `gigpo/core_gigpo.py`
  (`episode_norm_reward`, `compute_teacher_token_advantage`,
  `compute_opid_advantage_components`) and `examples/opid_trainer/run_alfworld_opid_guide.sh`
  (`shared/methods/distill_and_structure.md` A8 and its corrections). Hindsight skills
  (natural-language lessons an analyser extracts from finished trajectories) are put into
  the context and the *old* policy re-scores the same sampled response; the log-prob shift
  is a token advantage added to the outcome advantage:

  .. math::
    Â_b = (R_b − μ_g)/(σ_g + ε)   ("mean_std_norm", σ unbiased)    Â_b = R_b − μ_g   ("mean_norm")
    T^e_{b,t} = sg(ℓ^{ep}_{b,t} − ℓˢ_{b,t}),     T^s_{b,t} = sg(ℓ^{step}_{b,t} − ℓˢ_{b,t})
    A_{b,t} = M_{b,t} · ( Â_b + w_e T^e_{b,t} + w_s T^s_{b,t} )

  with ℓˢ = `logprob_old`, ℓ^{ep} = `logprob_alt` (the old policy, episode skill in the
  context) and ℓ^{step} = `logprob_teacher` (the old policy, step-level skill of a
  critical step in the context; optional, no step term when None).

  Defaults are the ALFWorld script's, which differ from the code's function defaults (in
  parentheses): mode "mean_std_norm" ("mean_norm"), w_e = 0.001 (1.0), w_s = 0.001 (0.0);
  teacher normalisation off, no clip, `failed_only` off, success threshold 1.0 (both). A
  group with one trajectory gets μ = 0, σ = 1 as in the code (`singleton="raw"`:
  Â = R/(1+ε), or R in "mean_norm"); "zero" is the library's convention.

  Layout. The code runs on verl-agent's step layout (one row per environment step) and by
  default (`compute_mean_std_cross_steps=True`) takes μ, σ over all step rows of a group, so
  a trajectory with more steps weighs more. This function takes the statistics over the
  batch rows of each group: in this library's layout (one row per trajectory, its turns
  marked by `turn_id`) rows and trajectories coincide and Â is the usual per-trajectory
  one; fed the step layout (one row per step, the episode reward repeated on each row,
  `group_id` the prompt) it is exactly the code's default. The code's per-trajectory
  alternative in the step layout needs a trajectory id, which is not a contract field: not
  wired.

  Skill masks and routing. The code gates T^e and T^s with per-row masks (skill present;
  "step_priority" routing makes them exclusive). They are not contract fields: the loop
  encodes "no skill here" by passing `logprob_old` itself in that field (T = 0 exactly), and
  applies the routing when it builds the two contexts. `failed_only` zeroes both terms on
  rows with R ≥ τ (the code gives skills only to failed trajectories). Not wired: the OPD
  start/stop schedule (the caller sets the weights to 0).

  GiGPO step term (`gigpo_step`, static; the code's `step_advantage_w`, 0 in the scripts,
  so off by default): w_g · Ã_{b,k(t)} is added on the tokens of turn k, with Ã from
  `opid_gigpo_step_advantages` (discounted per-turn returns, γ = `gigpo_gamma`, normalised
  within the anchor-state step groups, with the episode term's `mode`); it needs
  `step_reward`, `state_key`, `step_mask` and `turn_id`. The code's invalid-action penalty
  on the step returns is an environment detail left to the caller. w_g = `gigpo_weight`
  (1.0, GiGPO's default when the term is on).

  Choices (ours): a NaN teacher difference (−inf in both contexts) counts as 0; ±inf
  differences stay infinite unless `clip_teacher` is set, so callers should clamp −inf
  log-probs (e.g. to −1e9 → large finite); rows invalid for the group statistics (empty,
  out-of-range group id) get 0. The output carries no gradient.

  Args:
    reward: [B] float episode rewards.
    group_id: [B] int group of each row in [0, num_groups); unused (may be None) when
      `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float ℓˢ, the old policy on the sampled tokens (plain context).
    logprob_alt: [B,T] float ℓ^{ep}, the same tokens with the episode skill in the context.
    logprob_teacher: optional [B,T] float ℓ^{step}, with the step-level skill in the context.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    mode: static, "mean_std_norm" or "mean_norm" (no division by σ).
    episode_weight: w_e.
    step_weight: w_s (used only with `logprob_teacher`).
    singleton: static, "raw" (code: μ = 0, σ = 1) or "zero".
    normalize_teacher: static, standardise each teacher term over its active tokens.
    clip_teacher: None or a clip c > 0 applied to each teacher term (after normalising).
    failed_only: static, teacher terms only on rows with R < τ.
    success_threshold: τ for `failed_only`.
    eps: ε of the episode normalisation and of the teacher normalisation.
    gigpo_step: static, add the GiGPO step term (see above).
    step_reward: [B,K] per-turn rewards; state_key: [B,K] int anchor-state keys;
      step_mask: [B,K] bool; turn_id: [B,T] int (all four only with `gigpo_step`).
    gigpo_weight: w_g. gigpo_gamma: γ of the step returns.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

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
