"""Log-probability of the reference answer as the reward of a chain of thought."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.advantages.implicit import _likelihood as lk
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["logprob_reward_advantages", "answer_logprob_reward"]

_PAPER = ("Likelihood-Based Reward Designs for General LLM Reasoning (comparison of "
          "log-prob, VeriFree, JEPO and RLPR rewards), arXiv 2602.03979")


def answer_logprob_reward(*, logprob_answer: ArrayLike, answer_mask: ArrayLike,
                          length_normalize: bool = False,
                          floor: ArrayLike = -100.0) -> Array:
  """R_b = max(Σ_j log p(a*_j | x, z_b, a*_{<j}), floor) (or the mean over answer tokens).

  Confidence: inferred (spec §17). Rows without answer tokens get 0.

  Args:
    logprob_answer: [B,A] float answer-token log-probs after prompt ⊕ response.
    answer_mask: [B,A] bool.
    length_normalize: static; mean instead of sum.
    floor: lower clip −C (ours; the log-prob is unbounded below).

  Returns:
    [B] float32 rewards.
  """
  lp_BA, m_BA, has_B = lk.answer_inputs(logprob_answer, answer_mask,
                                        jnp.shape(logprob_answer)[0])
  r_B = jnp.sum(lp_BA, axis=-1)
  if length_normalize:
    r_B = r_B / jnp.maximum(jnp.sum(m_BA, axis=-1, dtype=jnp.float32), 1.0)
  return jnp.where(has_B, jnp.maximum(r_B, jnp.asarray(floor, jnp.float32)), 0.0)


@register_estimator("logprob_reward",
                    needs=("group_id", "response_mask", "logprob_answer", "answer_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "length_normalize",
                                     "baseline"))
def logprob_reward_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                              logprob_answer: ArrayLike, answer_mask: ArrayLike,
                              num_groups: int, group_size: int | None = None,
                              floor: ArrayLike = -100.0, length_normalize: bool = False,
                              baseline: Literal["rloo", "grpo"] = "rloo",
                              eps: ArrayLike = 1e-6) -> Array:
  """Log-prob reward: the reference answer's log-likelihood after the response, group-baselined.

  Paper: "Likelihood-Based Reward Designs for General LLM Reasoning", arXiv 2602.03979
  (`shared/methods/token_and_implicit.md` §17), which recommends the plain log-prob of the
  reference answer among the likelihood rewards it compares.

  Confidence: inferred (from the abstract; the reward follows it, the baseline and the
  floor are ours). With z_b the sampled chain of thought and a* the reference answer:

  .. math::
    R_b = max(Σ_j log π(a*_j | x, z_b, a*_{<j}), −C)       (or the mean over j)
    "rloo": A_b = R_b − mean_{j≠b in group} R_j;  "grpo": (R_b − μ_g)/(σ_g + ε)

  `logprob_answer` is a teacher-forced forward of x ⊕ z ⊕ a* by the behaviour policy; the
  advantage is constant over the response tokens. Rows with an empty response or no answer
  tokens, singleton groups and equal rewards give exact 0. The training signal on the
  answer tokens themselves (a likelihood term on log π(a*|x,z)) is a separate loss, not
  part of this estimator.

  Args:
    group_id: [B] int group ids in [0, num_groups); may be None with `group_size`.
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the reference-answer tokens.
    answer_mask: [B,A] bool, valid answer tokens.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    floor: −C, lower clip of the reward (ours).
    length_normalize: static; mean log-prob per answer token instead of the sum.
    baseline: static, "rloo" | "grpo".
    eps: added to σ_g under "grpo".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.
  """
  fn = "logprob_reward_advantages"
  check_choice(fn, "baseline", baseline, lk.BASELINES)
  r_B = answer_logprob_reward(logprob_answer=logprob_answer, answer_mask=answer_mask,
                              length_normalize=length_normalize, floor=floor)
  has_B = jnp.any(jnp.asarray(answer_mask).astype(bool), axis=-1)
  rows = lk.rows(fn, group_id, response_mask, num_groups, group_size, r_B, has_B)
  return lk.group_advantages(fn, r_B, rows, num_groups, group_size, baseline, eps)
