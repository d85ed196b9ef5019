"""RLPR: the mean per-token probability of the reference answer, debiased by the prompt-only
probability, as the reward."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.advantages.implicit import _likelihood as lk
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["rlpr_advantages", "rlpr_reward"]

_PAPER = ("RLPR: Extrapolating RLVR to General Domains without Verifiers (Yu et al.), "
          "arXiv 2506.18254")


def rlpr_reward(*, logprob_answer: ArrayLike, answer_mask: ArrayLike,
                logprob_answer_prior: ArrayLike | None = None) -> Array:
  """R_b = mean_j π(a*_j | x, z_b, a*_{<j}); with the prior, clip(R_b − R_prior_b, 0, 1).

  Confidence: code-verified (OpenBMB/RLPR at 8490fca, `compute_scoreB` with
  `mean_exp_log_softmax` and the `threshold_0` shaping; the spec's §17 was recalled).
  Rows without answer tokens get 0.

  Args:
    logprob_answer: [B,A] float answer-token log-probs after prompt ⊕ response.
    answer_mask: [B,A] bool.
    logprob_answer_prior: optional [B,A] float log-probs of the same tokens after the
      prompt alone (debiasing).

  Returns:
    [B] float32 rewards.
  """
  lp_BA, m_BA, has_B = lk.answer_inputs(logprob_answer, answer_mask,
                                        jnp.shape(logprob_answer)[0])
  n_B = jnp.maximum(jnp.sum(m_BA, axis=-1, dtype=jnp.float32), 1.0)

  def mean_prob(lp):
    return jnp.sum(jnp.where(m_BA, jnp.exp(jnp.minimum(lp, 0.0)), 0.0), axis=-1) / n_B

  r_B = mean_prob(lp_BA)
  if logprob_answer_prior is not None:
    prior_BA = jnp.asarray(logprob_answer_prior, jnp.float32)
    lk.answer_inputs(prior_BA, m_BA, m_BA.shape[0])  # shape checks
    r_B = jnp.clip(r_B - mean_prob(jnp.where(m_BA, prior_BA, 0.0)), 0.0, 1.0)
  return jnp.where(has_B, r_B, 0.0)


@register_estimator("rlpr",
                    needs=("group_id", "response_mask", "logprob_answer", "answer_mask",
                           "logprob_answer_prior"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "debias", "baseline",
                                     "format_coef"),
                    optional_needs={"format_ok": "format_coef"})
def rlpr_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_answer: ArrayLike, answer_mask: ArrayLike,
                    logprob_answer_prior: ArrayLike | None, num_groups: int,
                    group_size: int | None = None, format_ok: ArrayLike | None = None,
                    format_coef: float = 0.1, reward_scale: ArrayLike = 1.0,
                    debias: bool = True, baseline: Literal["rloo", "grpo"] = "grpo",
                    eps: ArrayLike = 1e-6) -> Array:
  """RLPR: debiased mean answer-token probability, group-normalised.

  Paper: "RLPR: Extrapolating RLVR to General Domains without Verifiers" (Yu et al.),
  arXiv 2506.18254 (`shared/methods/token_and_implicit.md` §17).

  Confidence: code-verified (the spec's RLPR details were recalled; the authors' code was
  read for this, see below). With z_b the sampled reasoning, a* the reference answer of
  |a*| tokens:

  .. math::
    R_b = 1/|a*| Σ_j π(a*_j | x, z_b, a*_{<j})            (mean token probability)
    R'_b = clip(R_b − 1/|a*| Σ_j π(a*_j | x, a*_{<j}), 0, 1)     (`debias=True`)
    S_b = (1 − c)·R'_b + c·f_b          (f_b = format_ok_b ∈ {0, 1}, c = `format_coef`)
    A_b = (S_b − μ_g)/(σ_g + ε)                         ("grpo", default; or "rloo")

  The paper's filter of prompts whose reward std is below a threshold is a training-loop
  concern (not here). Rows with an empty response or no answer tokens, singleton groups
  and equal rewards give exact 0; the std is the unbiased one (ours).

  Read against the authors' code (OpenBMB/RLPR at 8490fca, `reward_manager/prob.py`,
  `ray_trainer.py` and `examples/RLPR/reproduce_qwen.sh`, 2026-12-07). Agrees: the mean
  token probability (`compute_score_name=mean_exp_log_softmax`), the debiasing clipped at
  0 (`shaping_function_name=threshold_0`; R − R_prior ≤ 1 already), the gold answer
  written after the response's answer tag (appended with the tag when the response has
  none; the runner's `answer_pass` does the same with the task's `answer_marker`), GRPO
  advantages, and two parts now reproduced: the format term S = (1 − c)·R' + c·f with
  c = 0.1 (`format_coefficient`'s default; f the response's R1 tag format there, the
  runner's `format_ok` here: the task's format check, else the response ended by itself),
  and the prior computed with the initial policy and kept fixed
  (`compute_promptgt2scoreA(0)` before training; the runner's `answer_prior_scorer`
  "auto" scores it with the frozen reference for `rlpr`). Not reproduced: a repetition
  penalty (−1 for a response in which a 10-word window repeats 10 times;
  `repetition_penalty=True`) and the EMA reward-std prompt filter, training-loop parts of
  its runs, and its `format_coefficient=-1` mode (S = R' when formatted, else −1).
  `format_coef=0` (static switch: the registry then does not ask for `format_ok`) gives
  the reward without the format term; a `format_ok` left out counts every row as
  formatted.

  Args:
    group_id: [B] int group ids in [0, num_groups); may be None with `group_size`.
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the answer tokens after prompt ⊕ response.
    answer_mask: [B,A] bool.
    logprob_answer_prior: [B,A] float log-probs of the answer after the prompt alone;
      ignored (may be None) with `debias=False`.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    format_ok: optional [B] bool, the response has the output format (f_b); None: all 1.
    format_coef: static c in [0, 1], the format term's weight (0.1, the code's default).
    reward_scale: multiplies S (ours; 1 = RLPR).
    debias: static; subtract the prompt-only probability and clip to [0, 1].
    baseline: static, "grpo" | "rloo".
    eps: added to σ_g under "grpo".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.
  """
  fn = "rlpr_advantages"
  check_choice(fn, "baseline", baseline, lk.BASELINES)
  if not isinstance(debias, bool):
    raise ValueError(f"{fn}: debias must be a Python bool (static), got {debias!r}")
  if debias and logprob_answer_prior is None:
    raise ValueError(f"{fn}: debias=True needs logprob_answer_prior (or pass debias=False)")
  if not 0.0 <= float(format_coef) <= 1.0:
    raise ValueError(f"{fn}: format_coef must be in [0, 1], got {format_coef!r}")
  r_B = rlpr_reward(logprob_answer=logprob_answer, answer_mask=answer_mask,
                    logprob_answer_prior=logprob_answer_prior if debias else None)
  f_B = lk.format_flags(format_ok, r_B.shape[0]).astype(jnp.float32)
  r_B = (1.0 - format_coef) * r_B + format_coef * f_B
  r_B = jnp.asarray(reward_scale, jnp.float32) * r_B
  has_B = jnp.any(jnp.asarray(answer_mask).astype(bool), axis=-1)
  rows = lk.rows(fn, group_id, response_mask, num_groups, group_size, r_B, has_B)
  return lk.group_advantages(fn, r_B, rows, num_groups, group_size, baseline, eps)
