"""VeriFree: the probability of the reference answer after the response as the reward."""
from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.implicit import _likelihood as lk
from credit.registry import TrainedLoss, register_estimator

Array = jax.Array

__all__ = ["verifree_advantages", "VerifreeOutput", "answer_likelihood_loss"]

answer_likelihood_loss = lk.answer_likelihood_loss
_ANSWER_WEIGHTS = ("reward", "advantage", "one")


class VerifreeOutput(NamedTuple):
  advantages: Array     # [B,T] the policy-gradient advantages of the reasoning tokens
  answer_weight: Array  # [B] the weight of each row's answer-likelihood term

_PAPER = ("Reinforcing General Reasoning without Verifiers (VeriFree) (Zhou et al.), "
          "arXiv 2505.21493")


@register_estimator("verifree",
                    needs=("group_id", "response_mask", "logprob_answer", "answer_mask"),
                    paper=_PAPER, returns_output=True,
                    static_argnames=("num_groups", "group_size", "baseline", "answer_weight",
                                     "format_gate"),
                    optional_needs={"format_ok": "format_gate"},
                    # The released run's loss: policy gradient + answer term, unweighted.
                    trained_loss=TrainedLoss(
                        fn=lk.answer_likelihood_loss, fields=("answer_mask",),
                        targets=("answer_weight",), params=(), coef=1.0,
                        scores=("logprob_answer",)))
def verifree_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                        logprob_answer: ArrayLike, answer_mask: ArrayLike, num_groups: int,
                        group_size: int | None = None, format_ok: ArrayLike | None = None,
                        format_gate: bool = True, reward_scale: ArrayLike = 1.0,
                        baseline: Literal["rloo", "grpo"] = "rloo",
                        answer_weight: Literal["reward", "advantage", "one"] = "reward",
                        eps: ArrayLike = 1e-6) -> VerifreeOutput:
  """VeriFree: R = π(a* | x, z), the reference answer's probability, with an RLOO baseline.

  Paper: "Reinforcing General Reasoning without Verifiers" (Zhou et al.), arXiv 2505.21493
  (`shared/methods/token_and_implicit.md` §17).

  Confidence: code-verified (sail-sg/VeriFree at c9ae30c, `verifree.py` and the released
  `run.sh`, read for this; the spec was written from the abstract). With z_b the sampled
  reasoning and a* the reference answer:

  .. math::
    R_b = exp(Σ_j log π(a*_j | x, z_b, a*_{<j}))   (0 where format_ok_b is false)
    A_b = R_b − mean_{j≠b in group} R_j       ("rloo", default; "grpo" z-scores instead)
    L = −mean_b A_b Σ_t log π(z_{b,t})  −  mean_b w_b Σ_j log π(a*_j | x, z_b, a*_{<j})

  The second term trains the answer tokens directly (the gradient of E_z π(a* | x, z) has
  both parts). It is `answer_likelihood_loss` with the per-row weight `answer_weight`
  returned here: the released run's w = R ("reward", `--sft_coef_source reward`), the
  code's other choices "advantage" (w = A, its argument default) and "one". The registry's
  `trained_loss` makes the experiment runner add it to each minibatch's loss with the
  answer rescored under the update's parameters (coefficient 1, as the port adds the two).
  The reward vanishes for long answers (the failure mode the comparison paper reports).
  Rows with an empty response or no answer tokens, singleton groups and equal rewards
  give exact 0 advantage; rows with an empty response or no answer tokens get w = 0.

  The format gate (the port's default, on here): the port scores the answer after the
  response cut at "<answer" (its template's tag) and gives R = 0 (log R = −inf) to a
  response without the tag or stopped by the length limit; such a row stays in its group
  (its RLOO baseline counts it) and trains no answer tokens. Here a row with
  `format_ok` false gets R = 0 and w = 0 and stays in its group. The runner's
  `format_check` producer makes `format_ok`: the task's own format check where it has
  one (`chain`: running sums, the marker, an integer answer — stricter than the tag
  alone), else "the response ended by itself" (a stop token, not the length limit).
  `format_gate=False` (static) does not ask for `format_ok`: every row's answer is
  scored, after the response cut at the task's `answer_marker` (`answer_pass`; a row
  without it gets the marker inserted) or after the whole response. A `format_ok` given
  with the gate off is applied too; without `format_ok` no row is gated.
  The port's policy term sums the reasoning tokens' log-probs per row without a ratio (one
  epoch); in the runner that is the policy loss's choice (`policy_loss`, its aggregation).

  Args:
    group_id: [B] int group ids in [0, num_groups); may be None with `group_size`.
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the reference-answer tokens.
    answer_mask: [B,A] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    format_ok: optional [B] bool, the response has the output format and ended by itself;
      R = 0 and w = 0 where false.
    format_gate: static; True (default) makes the registry ask for `format_ok`.
    reward_scale: multiplies R (ours; 1 = the answer probability; the port's
      `reward_scale` multiplies log R instead, 1 in its run).
    baseline: static, "rloo" | "grpo".
    answer_weight: static, the answer term's weight: "reward" (R), "advantage" (A) or
      "one".
    eps: added to σ_g under "grpo".

  Returns:
    VerifreeOutput: advantages [B,T] float32 (zero outside `response_mask`) and
    answer_weight [B] float32.
  """
  fn = "verifree_advantages"
  check_choice(fn, "baseline", baseline, lk.BASELINES)
  check_choice(fn, "answer_weight", answer_weight, _ANSWER_WEIGHTS)
  lp_BA, _, has_B = lk.answer_inputs(logprob_answer, answer_mask,
                                     jnp.shape(logprob_answer)[0])
  ok_B = lk.format_flags(format_ok, lp_BA.shape[0])
  r_B = jnp.where(has_B & ok_B, jnp.exp(jnp.minimum(jnp.sum(lp_BA, axis=-1), 0.0)), 0.0)
  r_B = jnp.asarray(reward_scale, jnp.float32) * r_B
  rows = lk.rows(fn, group_id, response_mask, num_groups, group_size, r_B, has_B)
  adv_B = lk.row_advantages(fn, r_B, rows, num_groups, group_size, baseline, eps)
  w_B = {"reward": r_B, "advantage": adv_B, "one": jnp.ones_like(r_B)}[answer_weight]
  return VerifreeOutput(ops.broadcast_to_tokens(adv_B, rows.mask),
                        jnp.where(rows.valid & ok_B, w_B, 0.0))
