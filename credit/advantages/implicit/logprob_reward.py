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

  Rows without answer tokens get 0.

  Args:
    logprob_answer: [B,A] float answer-token log-probs after prompt ⊕ response.
    answer_mask: [B,A] bool.
    length_normalize: static; mean instead of sum.
    floor: lower clip −C (the log-prob is unbounded below).

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
                                     "baseline"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def logprob_reward_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                              logprob_answer: ArrayLike, answer_mask: ArrayLike,
                              num_groups: int, group_size: int | None = None,
                              floor: ArrayLike = -100.0, length_normalize: bool = False,
                              baseline: Literal["rloo", "grpo"] = "rloo",
                              eps: ArrayLike = 1e-6) -> Array:
  """Log-prob reward: the reference answer's log-likelihood after the response, group-baselined.

  With z_b the sampled chain of thought and a* the reference answer, teacher-forced after
  prompt ⊕ response by the behaviour policy::

    R_b = max(Σ_j log π(a*_j | x, z_b, a*_{<j}), −C)         (or the mean over j)
    "rloo": A_b = R_b − mean_{j≠b in group} R_j;   "grpo": A_b = (R_b − μ_g) / (σ_g + ε)

  constant over the response tokens. Training the answer tokens themselves is a separate
  loss, not part of this estimator.

  Paper: "Likelihood-Based Reward Designs for General LLM Reasoning", arXiv 2602.03979,
  which recommends the plain log-prob of the reference answer among the likelihood rewards
  it compares. The baseline and the floor are this library's. Rows with an empty response
  or no answer tokens, one-row groups and equal rewards give exact 0.

  Args:
    group_id: [B] int group ids (may be None with `group_size`).
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the reference-answer tokens.
    answer_mask: [B,A] bool, valid answer tokens.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    floor: −C, lower clip of the reward.
    length_normalize: static; mean log-prob per answer token instead of the sum.
    baseline: static, "rloo" | "grpo".
    eps: added to σ_g under "grpo".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> lp = np.log(np.array([[.9, .8], [.5, .5], [.2, .9], [.1, .1]], np.float32))
    >>> a = logprob_reward_advantages(group_id=np.zeros(4, np.int32),
    ...                               response_mask=np.ones((4, 2), bool), logprob_answer=lp,
    ...                               answer_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [2.2403, 0.8299, 0.3919, -3.462]
  """
  fn = "logprob_reward_advantages"
  check_choice(fn, "baseline", baseline, lk.BASELINES)
  r_B = answer_logprob_reward(logprob_answer=logprob_answer, answer_mask=answer_mask,
                              length_normalize=length_normalize, floor=floor)
  has_B = jnp.any(jnp.asarray(answer_mask).astype(bool), axis=-1)
  rows = lk.rows(fn, group_id, response_mask, num_groups, group_size, r_B, has_B)
  return lk.group_advantages(fn, r_B, rows, num_groups, group_size, baseline, eps)
