"""ReWAM: retrieval-aware self-distillation (a privileged self-teacher) and its stopping targets."""
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

__all__ = ["RewamOutput", "rewam_advantages", "rewam_stop_targets"]

_PAPER = ("Reason What Matters: Retrieval-Grounded Reasoning for Universal Multimodal "
          "Embeddings (ReWAM: retrieval-aware self-distillation, retrieval-adaptive "
          "inference), arXiv preprint")


class RewamOutput(NamedTuple):
  """`advantages` [B,T] and the self-teacher's token signal `teacher` [B,T] (0 off mask)."""
  advantages: Array
  teacher: Array


@register_estimator("rewam", needs=("reward", "group_id", "response_mask", "logprob_old",
                                    "logprob_alt"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size", "scale"),
                    returns_output=True, confidence="inferred",
                    source=_PAPER + " (abstract: an on-policy self-teacher conditioned on "
                    "retrieval-aware privileged guidance gives token-level feedback; a "
                    "stopping criterion learned from prefix-level retrieval feedback; the code "
                    "was announced, not released)")
def rewam_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                     logprob_old: ArrayLike, logprob_alt: ArrayLike, num_groups: int,
                     group_size: int | None = None, teacher_coef: float = 0.1,
                     teacher_clip: float = 1.0, scale: str = "group",
                     eps: float = 1e-6) -> RewamOutput:
  """GRPO plus the token feedback of a self-teacher that sees what separates the right answer.

  ReWAM's retrieval-aware self-distillation (RASD) builds privileged guidance from the
  input-supported facts and the evidence that tells the positive candidate from the hard
  negatives, and lets the policy itself, conditioned on that guidance, re-score the response
  it sampled without it. Tokens the guided self-teacher finds more likely than the student
  did are the retrieval-relevant ones and gain credit; tokens it finds less likely lose it::

    s_t = clip(sg(log π(y_t | guidance, x, y_<t) − log π(y_t | x, y_<t)), −c, c)
    A_t = A^GRPO_b + α · s_t

  with the guided score `logprob_alt`, the plain one `logprob_old`, and A^GRPO the group-
  normalised outcome (retrieval) reward broadcast to the tokens (`scale` as `grpo`). The
  teacher term carries no gradient; masked positions get exact zeros. A group of one valid
  row, or of equal rewards, keeps the teacher term.

  Paper: "Reason What Matters: Retrieval-Grounded Reasoning for Universal Multimodal
  Embeddings" (ReWAM), arXiv preprint.

  What differs from the paper: ReWAM trains a multimodal embedding model whose chain of
  thought feeds a retrieval embedding, rewarded by retrieval against candidates and hard
  negatives, and speeds up inference with speculative decoding. The embedding model, the
  image inputs, the retrieval reward and the speculative decoding are left out (they need a
  multimodal encoder and a candidate corpus): the reward is whatever outcome the task
  gives, and the guidance is the context of `logprob_alt` (a re-scoring producer puts it in
  front of the prompt). The learned stopping rule is `rewam_stop_targets`, the labels a stop
  head would be trained on. The abstract gives no formula: the clipped log-ratio added to
  GRPO with weight α is this library's reading.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool policy tokens.
    logprob_old: [B,T] float the sampled tokens under the plain context (the student).
    logprob_alt: [B,T] float the same tokens under the guided context (the self-teacher).
    num_groups: static number of groups.
    group_size: static G for contiguous groups (the same numbers as the segment path).
    teacher_coef: α, the weight of the self-teacher term.
    teacher_clip: c > 0, the bound on the per-token log-ratio.
    scale: static; "group" (GRPO), "batch" or "none" for the outcome part.
    eps: added to the std of the outcome part.

  Returns:
    RewamOutput(advantages [B,T], teacher [B,T]).

  Example:
    >>> import numpy as np
    >>> student = np.log(np.array([[0.5, 0.5], [0.5, 0.5]], np.float32))
    >>> teacher = np.log(np.array([[0.9, 0.5], [0.5, 0.1]], np.float32))
    >>> out = rewam_advantages(reward=np.array([1., 0]), group_id=np.zeros(2, np.int32),
    ...                        response_mask=np.ones((2, 2), bool), logprob_old=student,
    ...                        logprob_alt=teacher, num_groups=1)
    >>> np.round(np.asarray(out.advantages, np.float64), 4).tolist()
    [[0.7659, 0.7071], [-0.7071, -0.8071]]
  """
  check_choice("rewam_advantages", "scale", scale, ops.GROUP_SCALES)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "rewam_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  lp_s, lp_t = (jnp.asarray(x, jnp.float32) for x in (logprob_old, logprob_alt))
  chex.assert_equal_shape([mask_BT, lp_s, lp_t])
  on_BT = mask_BT & valid_B[:, None]
  gap_BT = jnp.where(on_BT, lp_t, 0.0) - jnp.where(on_BT, lp_s, 0.0)
  c = jnp.asarray(teacher_clip, jnp.float32)
  teach_BT = jax.lax.stop_gradient(jnp.where(on_BT, jnp.clip(gap_BT, -c, c), 0.0))
  adv_B = ops.grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, scale, eps, "zero")
  adv_BT = ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
  adv_BT = adv_BT + jnp.asarray(teacher_coef, jnp.float32) * teach_BT
  return RewamOutput(advantages=jnp.where(mask_BT, adv_BT, 0.0), teacher=teach_BT)


def rewam_stop_targets(*, step_value: ArrayLike, step_mask: ArrayLike,
                       tolerance: ArrayLike = 0.0) -> Array:
  """ReWAM's stopping labels from prefix-level retrieval feedback.

  Retrieval-adaptive inference stops the chain of thought once more reasoning no longer
  improves retrieval. With the retrieval feedback v_k of the prefix ending at step k
  (`step_value`), a prefix is a stopping point when no later prefix beats it by more than
  the tolerance::

    stop_k = 1[v_k ≥ max_{k' > k} v_k' − tol]      (1 at the last valid step)

  These are the targets of a stop classifier over prefixes (trained with any binary loss);
  the earliest stopping point of a row is where inference would end. The classifier and
  the candidate-free inference are left out; the rule for the labels is this library's
  reading of the abstract.

  Args:
    step_value: [B,K] float retrieval feedback of each prefix (higher is better).
    step_mask: [B,K] bool valid prefixes.
    tolerance: tol ≥ 0, an improvement at most this large does not justify going on.

  Returns:
    [B,K] float32 labels in {0, 1}, 0 outside `step_mask`.

  Example:
    >>> import numpy as np
    >>> rewam_stop_targets(step_value=np.array([[0.2, 0.6, 0.6, 0.5]], np.float32),
    ...                    step_mask=np.ones((1, 4), bool)).tolist()
    [[0.0, 1.0, 1.0, 1.0]]
  """
  v_BK = jnp.asarray(step_value, jnp.float32)
  m_BK = jnp.asarray(step_mask, bool)
  chex.assert_rank([v_BK, m_BK], 2)
  chex.assert_equal_shape([v_BK, m_BK])
  masked = jnp.where(m_BK, v_BK, -jnp.inf)
  # Best value strictly after k: a reverse cumulative max shifted by one step.
  suffix = jax.lax.cummax(masked, axis=1, reverse=True)
  later = jnp.concatenate([suffix[:, 1:], jnp.full_like(suffix[:, :1], -jnp.inf)], axis=1)
  stop = v_BK >= later - jnp.asarray(tolerance, jnp.float32)
  return jnp.where(m_BK & stop, 1.0, 0.0)
