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
                    optional_needs={"format_ok": "format_coef"},
                    confidence="code-verified",
                    source=(_PAPER + "; code: OpenBMB/RLPR@8490fca reward_manager/prob.py "
                            "(compute_scoreB, mean_exp_log_softmax, threshold_0), "
                            "ray_trainer.py, examples/RLPR/reproduce_qwen.sh"))
def rlpr_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_answer: ArrayLike, answer_mask: ArrayLike,
                    logprob_answer_prior: ArrayLike | None, num_groups: int,
                    group_size: int | None = None, format_ok: ArrayLike | None = None,
                    format_coef: float = 0.1, reward_scale: ArrayLike = 1.0,
                    debias: bool = True, baseline: Literal["rloo", "grpo"] = "grpo",
                    eps: ArrayLike = 1e-6) -> Array:
  """RLPR: debiased mean answer-token probability (plus a format term), group-normalised.

  With z_b the sampled reasoning and a* the reference answer::

    R_b  = mean_j π(a*_j | x, z_b, a*_{<j})                    (mean token probability)
    R'_b = clip(R_b − mean_j π(a*_j | x, a*_{<j}), 0, 1)        (`debias=True`)
    S_b  = (1 − c) R'_b + c f_b          (f_b = `format_ok`, c = `format_coef`)
    A_b  = (S_b − μ_g) / (σ_g + ε)        ("grpo", default; or "rloo")

  Paper: "RLPR: Extrapolating RLVR to General Domains without Verifiers",
  arXiv 2506.18254. As the authors' code: the mean token probability, the debiasing
  clipped at 0, the format term with c = 0.1, and a prior scored once by the initial
  policy (the runner's `answer_prior_scorer="auto"` uses the frozen reference for it).
  Not reproduced: the code's repetition penalty and its reward-std prompt filter
  (training-loop parts). Rows with an empty response or no answer tokens, one-row groups
  and equal scores give exact 0.

  Args:
    group_id: [B] int group ids (may be None with `group_size`).
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the answer tokens after prompt ⊕ response.
    answer_mask: [B,A] bool.
    logprob_answer_prior: [B,A] float log-probs of the answer after the prompt alone;
      ignored (may be None) with `debias=False`.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    format_ok: optional [B] bool, the response has the output format (None: all 1).
    format_coef: static c in [0, 1]; 0 drops the format term (and the `format_ok` need).
    reward_scale: multiplies S.
    debias: static; subtract the prompt-only probability and clip to [0, 1].
    baseline: static, "grpo" | "rloo".
    eps: added to σ_g under "grpo".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> lp = np.log(np.array([[.9, .8], [.5, .5], [.2, .9], [.1, .1]], np.float32))
    >>> a = rlpr_advantages(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 2), bool),
    ...                     logprob_answer=lp, answer_mask=np.ones((4, 2), bool),
    ...                     logprob_answer_prior=np.log(np.full((4, 2), .5, np.float32)),
    ...                     num_groups=1, format_coef=0.0)   # R' = [.35, 0, .05, 0]
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [1.4852, -0.5941, -0.297, -0.5941]
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
