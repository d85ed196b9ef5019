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
                        scores=("logprob_answer",)),
                    confidence="code-verified",
                    source=_PAPER + "; code: sail-sg/VeriFree@c9ae30c verifree.py, run.sh")
def verifree_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                        logprob_answer: ArrayLike, answer_mask: ArrayLike, num_groups: int,
                        group_size: int | None = None, format_ok: ArrayLike | None = None,
                        format_gate: bool = True, reward_scale: ArrayLike = 1.0,
                        baseline: Literal["rloo", "grpo"] = "rloo",
                        answer_weight: Literal["reward", "advantage", "one"] = "reward",
                        eps: ArrayLike = 1e-6) -> VerifreeOutput:
  """VeriFree: R = π(a* | x, z), the reference answer's probability, with an RLOO baseline.

  With z_b the sampled reasoning and a* the reference answer::

    R_b = exp(Σ_j log π(a*_j | x, z_b, a*_{<j}))     (0 where `format_ok` is false)
    A_b = R_b − mean_{j≠b in group} R_j               ("rloo"; "grpo" z-scores instead)
    L = −mean_b A_b Σ_t log π(z_{b,t}) − mean_b w_b Σ_j log π(a*_j | x, z_b, a*_{<j})

  The second term trains the answer tokens directly (the gradient of E_z π(a* | x, z) has
  both parts): it is `answer_likelihood_loss` with the returned `answer_weight` w, which
  the registration's `trained_loss` makes the runner add to every minibatch's loss.

  Paper: "Reinforcing General Reasoning without Verifiers", arXiv 2505.21493. As the
  authors' released run: w = R, the two terms added with weight 1, and the format gate
  (R = 0 and w = 0 for a response without the output format or stopped by the length
  limit; such a row stays in its group). The reward vanishes for long answers.

  Args:
    group_id: [B] int group ids (may be None with `group_size`).
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the reference-answer tokens.
    answer_mask: [B,A] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    format_ok: optional [B] bool; R = 0 and w = 0 where false (None: no row gated).
    format_gate: static; True (default) makes the registry ask for `format_ok`.
    reward_scale: multiplies R.
    baseline: static, "rloo" | "grpo".
    answer_weight: static, the answer term's weight: "reward" (R) | "advantage" (A) | "one".
    eps: added to σ_g under "grpo".

  Returns:
    VerifreeOutput: advantages [B,T] float32 (zero outside `response_mask`) and
    answer_weight [B] float32.

  Example:
    >>> import numpy as np
    >>> lp = np.log(np.array([[.9, .8], [.5, .5], [.2, .9], [.1, .1]], np.float32))
    >>> out = verifree_advantages(group_id=np.zeros(4, np.int32),
    ...                           response_mask=np.ones((4, 2), bool), logprob_answer=lp,
    ...                           answer_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()
    [0.5733, -0.0533, -0.1467, -0.3733]
    >>> np.round(np.asarray(out.answer_weight, np.float64), 4).tolist()   # w = R
    [0.72, 0.25, 0.18, 0.01]
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
