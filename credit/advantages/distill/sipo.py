"""SIPO: a contrastive self-teacher token term added to the GRPO advantage."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import GROUP_STDS, sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["sipo_advantages", "sipo_contrast", "CONTRASTS"]

_PAPER = ("SIPO: contrastive self-teacher advantage from reference-answer and group-mistake "
          "contexts, arXiv preprint")
CONTRASTS = ("group_mistake", "always")


def sipo_contrast(*, response_mask: ArrayLike, logprob_alt_pos: ArrayLike,
                  logprob_alt_neg: ArrayLike, kappa: ArrayLike = 1.0) -> Array:
  """The clipped contrast clip(ℓ⁺ − ℓ⁻, −κ, κ) on valid tokens ([B,T] float32, no gradient).

  A difference that is NaN (both contexts give −inf, or a NaN input) counts as 0 (ours);
  ±inf differences clip to ±κ. Entries outside `response_mask` are exact zeros.
  """
  mask_BT = jnp.asarray(response_mask)
  pos_BT = jnp.asarray(logprob_alt_pos, jnp.float32)
  neg_BT = jnp.asarray(logprob_alt_neg, jnp.float32)
  chex.assert_rank([mask_BT, pos_BT, neg_BT], 2)
  chex.assert_equal_shape([mask_BT, pos_BT, neg_BT])
  mask_BT = mask_BT.astype(bool)
  kappa = jnp.asarray(kappa, jnp.float32)
  d_BT = jnp.where(mask_BT, pos_BT, 0.0) - jnp.where(mask_BT, neg_BT, 0.0)
  d_BT = jnp.where(jnp.isnan(d_BT), 0.0, d_BT)
  return jax.lax.stop_gradient(jnp.where(mask_BT, jnp.clip(d_BT, -kappa, kappa), 0.0))


@register_estimator(
    "sipo", needs=("reward", "group_id", "response_mask", "logprob_alt_pos", "logprob_alt_neg"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "contrast", "group_std"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def sipo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_alt_pos: ArrayLike, logprob_alt_neg: ArrayLike, num_groups: int,
                    group_size: int | None = None, beta: ArrayLike = 1.0,
                    kappa: ArrayLike = 1.0, success_threshold: ArrayLike = 1.0,
                    contrast: Literal["group_mistake", "always"] = "group_mistake",
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """SIPO: GRPO plus the clipped log-prob contrast between two self-teacher contexts.

  The policy re-scores each rollout's tokens under two contexts built from the reference
  answer and a mistake seen in its group; their difference is a token advantage in which
  whatever the two contexts share cancels, and it gives credit even in all-fail groups::

    c_b = 1[some valid row of g(b) has R < τ]     ("group_mistake";  "always": c_b = 1)
    A[b,t] = M[b,t] · (Â_b + β · clip(ℓ⁺[b,t] − ℓ⁻[b,t], −κ, κ) · c_b)

  with ℓ⁺ = `logprob_alt_pos` (reference answer, marked correct) and ℓ⁻ =
  `logprob_alt_neg` (reference answer plus one of the group's mistakes). The student's own
  log-prob is not used. A group without a mistake has nothing to pair and gets plain GRPO.
  A NaN contrast counts as 0; the output carries no gradient.

  Paper: "SIPO: contrastive self-teacher advantage" (arXiv preprint). The abstract gives
  the idea but no equation: the formula and β = κ = 1, τ = 1 are this library's reading.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_alt_pos: [B,T] float sampled-token log-probs under the "reference answer,
      correct" context.
    logprob_alt_neg: [B,T] float the same under "reference answer + a group mistake".
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    beta: β, weight of the contrast term (may be an array).
    kappa: κ > 0, clip of the contrast.
    success_threshold: τ; a rollout with R < τ is a mistake.
    contrast: static, "group_mistake" | "always".
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = sipo_advantages(reward=np.zeros(2), group_id=np.zeros(2, np.int32),
    ...                     response_mask=np.array([[1, 1, 1], [0, 0, 0]], bool),
    ...                     logprob_alt_pos=np.array([[-0.2, -1.0, -0.7], [0., 0., 0.]]),
    ...                     logprob_alt_neg=np.array([[-0.5, -0.4, -0.7], [0., 0., 0.]]),
    ...                     num_groups=1)
    >>> np.round(np.asarray(a[0], np.float64), 6).tolist()
    [0.3, -0.6, 0.0]
  """
  check_choice("sipo_advantages", "contrast", contrast, CONTRASTS)
  check_choice("sipo_advantages", "group_std", group_std, GROUP_STDS)
  rows = ops.group_rows("sipo_advantages", reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  if contrast == "always":
    has_B = rows.valid
  else:
    mistake_B = (rows.values < jnp.asarray(success_threshold, jnp.float32)).astype(jnp.float32)
    any_B = ops.group_reduce_rows(mistake_B, rows.group_id, rows.valid, num_groups,
                                  group_size, "max")
    has_B = rows.valid & (any_B > 0)
  c_BT = sipo_contrast(response_mask=rows.mask, logprob_alt_pos=logprob_alt_pos,
                       logprob_alt_neg=logprob_alt_neg, kappa=kappa)
  beta = jnp.asarray(beta, jnp.float32)
  out_BT = adv_B[:, None] + beta * jnp.where(has_B[:, None], c_BT, 0.0)
  ok_BT = rows.mask & rows.valid[:, None]
  return jax.lax.stop_gradient(jnp.where(ok_BT, out_BT, 0.0))
