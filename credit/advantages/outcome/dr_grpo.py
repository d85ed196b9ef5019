"""Dr.GRPO: the group-mean baseline without the std division."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import grpo_scalar
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["dr_grpo_advantages"]

_PAPER = ("Understanding R1-Zero-Like Training: A Critical Perspective (Dr.GRPO), "
          "arXiv 2503.20783")


@register_estimator("dr_grpo", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "singleton"))
def dr_grpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, group_size: int | None = None,
                       singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Dr.GRPO advantage: the group-mean baseline without std division.

  Confidence: code-verified (verl `compute_grpo_outcome_advantage` with
  `norm_adv_by_std_in_grpo=False`).

  Paper: "Understanding R1-Zero-Like Training: A Critical Perspective",
  arXiv 2503.20783, §3.2: a_i = R_i − μ_g, A[i,t] = a_i·M[i,t]
  (`shared/methods/outcome_and_clipping.md` §2). The paper's other change (a constant
  loss normaliser instead of 1/|o_i|) belongs to the loss (`seq-mean-token-sum-norm`),
  not here.

  Args/Returns: as `grpo_advantages` (no `scale`, no `eps`).
  """
  check_choice("dr_grpo_advantages", "singleton", singleton, ops.SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "dr_grpo_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  adv_B = grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, "none", 0.0, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
