"""VeriFree: the probability of the reference answer after the response as the reward."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.advantages.implicit import _likelihood as lk
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["verifree_advantages"]

_PAPER = ("Reinforcing General Reasoning without Verifiers (VeriFree) (Zhou et al.), "
          "arXiv 2505.21493")


@register_estimator("verifree",
                    needs=("group_id", "response_mask", "logprob_answer", "answer_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "baseline"))
def verifree_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                        logprob_answer: ArrayLike, answer_mask: ArrayLike, num_groups: int,
                        group_size: int | None = None, reward_scale: ArrayLike = 1.0,
                        baseline: Literal["rloo", "grpo"] = "rloo",
                        eps: ArrayLike = 1e-6) -> Array:
  """VeriFree: R = π(a* | x, z), the reference answer's probability, with an RLOO baseline.

  Paper: "Reinforcing General Reasoning without Verifiers" (Zhou et al.), arXiv 2505.21493
  (`shared/methods/token_and_implicit.md` §17).

  Confidence: inferred (spec written from abstracts; no code read). With z_b the sampled
  reasoning and a* the reference answer:

  .. math::
    R_b = exp(Σ_j log π(a*_j | x, z_b, a*_{<j}))
    A_b = R_b − mean_{j≠b in group} R_j       ("rloo", default; "grpo" z-scores instead)

  The paper also trains log π(a* | x, z) directly, weighted by R (the answer-token term);
  that term is a separate loss on the answer tokens, not part of these advantages. The
  reward vanishes for long answers (the failure mode the comparison paper reports).
  Rows with an empty response or no answer tokens, singleton groups and equal rewards
  give exact 0.

  Args:
    group_id: [B] int group ids in [0, num_groups); may be None with `group_size`.
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the reference-answer tokens.
    answer_mask: [B,A] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    reward_scale: multiplies R (ours; 1 = the answer probability).
    baseline: static, "rloo" | "grpo".
    eps: added to σ_g under "grpo".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.
  """
  fn = "verifree_advantages"
  check_choice(fn, "baseline", baseline, lk.BASELINES)
  lp_BA, _, has_B = lk.answer_inputs(logprob_answer, answer_mask,
                                     jnp.shape(logprob_answer)[0])
  r_B = jnp.where(has_B, jnp.exp(jnp.minimum(jnp.sum(lp_BA, axis=-1), 0.0)), 0.0)
  r_B = jnp.asarray(reward_scale, jnp.float32) * r_B
  rows = lk.rows(fn, group_id, response_mask, num_groups, group_size, r_B, has_B)
  return lk.group_advantages(fn, r_B, rows, num_groups, group_size, baseline, eps)
