"""FLR: the likelihood of positive minus negative user follow-ups as the reward."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice, check_int
from credit.advantages.implicit import _likelihood as lk
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["flr_advantages", "flr_reward"]

_PAPER = ("Aligning Language Models Using Follow-up Likelihood as Reward Signal (FLR) "
          "(Zhang et al.), arXiv 2409.13948")


def flr_reward(*, logprob_followup: ArrayLike, num_positive: int = 1) -> Array:
  """R_b = mean_{p<P} ℓ̄_{b,p} − mean_{n≥P} ℓ̄_{b,n} ([B]); an empty side counts 0.

  Args:
    logprob_followup: [B,F] float mean per-token log-prob of each follow-up text.
    num_positive: static P; the first P follow-ups are positive, the rest negative.

  Returns:
    [B] float32 rewards.
  """
  lf_BF = jnp.asarray(logprob_followup, jnp.float32)
  chex.assert_rank(lf_BF, 2)
  nf = lf_BF.shape[1]
  check_int("flr_reward", "num_positive", num_positive, minimum=0)
  if num_positive > nf:
    raise ValueError(f"flr_reward: num_positive={num_positive} exceeds the {nf} follow-ups")
  pos_B = jnp.mean(lf_BF[:, :num_positive], axis=-1) if num_positive else 0.0
  neg_B = jnp.mean(lf_BF[:, num_positive:], axis=-1) if num_positive < nf else 0.0
  return jnp.zeros(lf_BF.shape[:1], jnp.float32) + pos_B - neg_B


@register_estimator("flr", needs=("group_id", "response_mask", "logprob_followup"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "num_positive", "baseline"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def flr_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                   logprob_followup: ArrayLike, num_groups: int,
                   group_size: int | None = None, reward_scale: ArrayLike = 1.0,
                   num_positive: int = 1, baseline: Literal["rloo", "grpo"] = "rloo",
                   eps: ArrayLike = 1e-6) -> Array:
  """FLR: follow-up log-likelihoods (positive − negative) as the reward, group-baselined.

  A response is good when a user is likely to answer it positively: a language model scores
  P positive and N negative follow-up texts ("Thanks, that helps!" / "That's wrong.") after
  prompt ⊕ response. With ℓ̄_{b,f} the mean per-token log-prob of follow-up f::

    R_b = mean_{p<P} ℓ̄_{b,p} − mean_{n≥P} ℓ̄_{b,n}
    "rloo": A_b = R_b − mean_{j≠b in group} R_j;   "grpo": A_b = (R_b − μ_g) / (σ_g + ε)

  broadcast to the response tokens.

  Paper: "Aligning Language Models Using Follow-up Likelihood as Reward Signal",
  arXiv 2409.13948. The paper ranks candidates into DPO pairs or uses R as an RL reward;
  the group baseline is this library's choice. Rows with an empty response, one-row groups
  and equal rewards give exact 0.

  Args:
    group_id: [B] int group ids (may be None with `group_size`).
    response_mask: [B,T] bool.
    logprob_followup: [B,F] float mean per-token log-prob of each follow-up, positives
      first.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    reward_scale: multiplies R.
    num_positive: static P (the rest of the F follow-ups are negative).
    baseline: static, "rloo" | "grpo".
    eps: added to σ_g under "grpo".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> lf = np.array([[-1., -3.], [-2., -2.], [-1., -1.], [-3., -1.]], np.float32)
    >>> a = flr_advantages(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 2), bool),
    ...                    logprob_followup=lf, num_groups=1, num_positive=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()   # R = [2, 0, 0, −2]
    [2.6667, 0.0, 0.0, -2.6667]
  """
  fn = "flr_advantages"
  check_choice(fn, "baseline", baseline, lk.BASELINES)
  r_B = jnp.asarray(reward_scale, jnp.float32) * flr_reward(
      logprob_followup=logprob_followup, num_positive=num_positive)
  rows = lk.rows(fn, group_id, response_mask, num_groups, group_size, r_B)
  return lk.group_advantages(fn, r_B, rows, num_groups, group_size, baseline, eps)
