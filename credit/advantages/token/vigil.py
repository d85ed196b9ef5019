"""VIGIL: a penalty on "blind confidence", tokens confident even without the evidence."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["VigilOutput", "blind_confidence_penalty", "vigil_advantages"]

_PAPER = ("Staying VIGILant: Mitigating Visual Laziness via Counterfactual Visual Alignment in "
          "MLLMs (VIGIL, Visual Information Gain In aLignment), arXiv preprint")


class VigilOutput(NamedTuple):
  """`advantages` [B,T], the per-token `penalty` [B,T] and `info_gain` [B,T] (0 off mask)."""
  advantages: Array
  penalty: Array
  info_gain: Array


def blind_confidence_penalty(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                             logprob_alt: ArrayLike, confidence_threshold: ArrayLike = 0.5,
                             gain_margin: ArrayLike = 0.1) -> tuple[Array, Array]:
  """Per-token blind-confidence penalty and information gain (see `vigil_advantages`).

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float sampled-token log-prob with the evidence (the full context).
    logprob_alt: [B,T] float the same tokens with the evidence removed (the blind context).
    confidence_threshold: τ in (0, 1]; a token is blind-confident when π_blind ≥ τ.
    gain_margin: δ ≥ 0 (nats); the evidence should raise the token's log-prob by at least δ.

  Returns:
    (penalty [B,T], info_gain [B,T]) float32, exact zeros outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> pen, ig = blind_confidence_penalty(
    ...     response_mask=np.ones((1, 3), bool),
    ...     logprob_old=np.log(np.array([[0.9, 0.9, 0.3]], np.float32)),
    ...     logprob_alt=np.log(np.array([[0.9, 0.2, 0.8]], np.float32)))
    >>> np.round(np.asarray(pen, np.float64), 4).tolist()
    [[0.1, 0.0, 1.0808]]
  """
  mask_BT = jnp.asarray(response_mask)
  lp_full, lp_blind = (jnp.asarray(x, jnp.float32) for x in (logprob_old, logprob_alt))
  chex.assert_rank([mask_BT, lp_full, lp_blind], 2)
  chex.assert_equal_shape([mask_BT, lp_full, lp_blind])
  mask_BT = mask_BT.astype(bool)
  lp_full = jnp.where(mask_BT, lp_full, 0.0)
  lp_blind = jnp.where(mask_BT, lp_blind, 0.0)
  gain_BT = lp_full - lp_blind
  log_tau = jnp.log(jnp.asarray(confidence_threshold, jnp.float32))
  blind_BT = mask_BT & (jax.lax.stop_gradient(lp_blind) >= log_tau)
  short_BT = jax.nn.relu(jnp.asarray(gain_margin, jnp.float32) - gain_BT)
  penalty_BT = jnp.where(blind_BT, short_BT, 0.0)
  return penalty_BT, jnp.where(mask_BT, gain_BT, 0.0)


@register_estimator("vigil", needs=("reward", "group_id", "response_mask", "logprob_old",
                                    "logprob_alt"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size", "scale"),
                    returns_output=True, confidence="inferred",
                    source=_PAPER + " (abstract: penalise blind confidence, certainty that "
                    "persists when the evidence is masked, measured as the information gain "
                    "between the full and the blind context)")
def vigil_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                     logprob_old: ArrayLike, logprob_alt: ArrayLike, num_groups: int,
                     group_size: int | None = None, blind_coef: float = 0.1,
                     confidence_threshold: float = 0.5, gain_margin: float = 0.1,
                     scale: str = "group", eps: float = 1e-6) -> VigilOutput:
  """GRPO advantages minus a per-token penalty on confidence that does not need the evidence.

  VIGIL asks that a response depend on the evidence it was given: the information a token
  draws from the evidence is its log-prob under the full context minus its log-prob under a
  blind context with the evidence masked out (a pointwise estimate of the mutual information
  between evidence and response). A token that is confident without the evidence and gains
  (almost) nothing from it is answered from the prior, not from the evidence, and is
  penalised::

    IG_t   = log π(y_t | evidence, x, y_<t) − log π(y_t | x, y_<t)     (logprob_old − logprob_alt)
    pen_t  = 1[π(y_t | x, y_<t) ≥ τ] · max(0, δ − IG_t)
    A_t    = A^GRPO_b − β · pen_t

  A^GRPO is the group-normalised outcome reward broadcast to the tokens (`scale` as
  `grpo`: "group", "batch" or "none"). The indicator carries no gradient. Masked positions
  get exact zeros; a group of one valid row keeps its penalty (the outcome part is 0).

  Paper: "Staying VIGILant: Mitigating Visual Laziness via Counterfactual Visual Alignment
  in MLLMs" (VIGIL, Visual Information Gain In aLignment), arXiv preprint.

  What differs from the paper: VIGIL masks the text-to-image attention of a multimodal
  model to build the blind state and penalises blind confidence as a geometric constraint
  in preference/RL post-training of MLLMs. The vision parts (attention masking of image
  tokens, the visual encoder) are left out: for text the evidence is the documents or the
  facts of the question, and the blind score `logprob_alt` is the same tokens re-scored under
  a context without them (a re-scoring producer supplies it). The abstract gives no formula:
  the hinge on the information gain, the confidence gate and the additive token penalty on
  top of GRPO are this library's reading.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool policy tokens.
    logprob_old: [B,T] float sampled-token log-prob under the full context.
    logprob_alt: [B,T] float the same tokens under the blind context (evidence removed).
    num_groups: static number of groups.
    group_size: static G for contiguous groups (the same numbers as the segment path).
    blind_coef: β, the weight of the penalty against the outcome advantage.
    confidence_threshold: τ, the blind probability above which a token counts as confident.
    gain_margin: δ (nats), the information gain below which a confident token is penalised.
    scale: static; "group" (GRPO), "batch" or "none" (Dr.GRPO) for the outcome part.
    eps: added to the std of the outcome part.

  Returns:
    VigilOutput(advantages [B,T], penalty [B,T], info_gain [B,T]).

  Example:
    >>> import numpy as np
    >>> full = np.log(np.array([[0.9, 0.9], [0.9, 0.3]], np.float32))
    >>> blind = np.log(np.array([[0.2, 0.2], [0.9, 0.8]], np.float32))
    >>> out = vigil_advantages(reward=np.array([1., 0]), group_id=np.zeros(2, np.int32),
    ...                        response_mask=np.ones((2, 2), bool), logprob_old=full,
    ...                        logprob_alt=blind, num_groups=1)
    >>> np.round(np.asarray(out.advantages, np.float64), 4).tolist()
    [[0.7071, 0.7071], [-0.7171, -0.8152]]
  """
  check_choice("vigil_advantages", "scale", scale, ops.GROUP_SCALES)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "vigil_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  penalty_BT, gain_BT = blind_confidence_penalty(
      response_mask=mask_BT, logprob_old=logprob_old, logprob_alt=logprob_alt,
      confidence_threshold=confidence_threshold, gain_margin=gain_margin)
  adv_B = ops.grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, scale, eps, "zero")
  adv_BT = ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
  adv_BT = adv_BT - jnp.asarray(blind_coef, jnp.float32) * penalty_BT
  return VigilOutput(advantages=jnp.where(mask_BT, adv_BT, 0.0), penalty=penalty_BT,
                     info_gain=gain_BT)
