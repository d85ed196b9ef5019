"""Perceval: GRPO advantage lowered on the tokens of spans a perception PRM flagged."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.token._redistribute import SINGLETONS, redistribute, signed_weights
from credit.ops.baselines import GROUP_STDS, sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["perceval_advantages"]

_PAPER = ("Improving Vision-language Models with Perception-centric Process Reward Models "
          "(Min et al.), CVPR 2026, https://openaccess.thecvf.com/content/CVPR2026/papers/"
          "Min_Improving_Vision-language_Models_with_Perception-centric_Process_Reward_Models_"
          "CVPR_2026_paper.pdf")


@register_estimator(
    "perceval", needs=("reward", "group_id", "response_mask", "flag_mask"), paper=_PAPER,
    static_argnames=("num_groups", "group_size", "group_std", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: RUCAIBox/Perceval verl/trainer/ppo/core_algos.py "
                            "compute_TRM_outcome_advantage, examples/perceval/train"))
def perceval_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                        response_mask: ArrayLike, flag_mask: ArrayLike, num_groups: int,
                        group_size: int | None = None, penalty: ArrayLike = 0.1,
                        group_std: Literal["unbiased", "population", "none"] = "unbiased",
                        singleton: Literal["zero", "raw"] = "zero",
                        eps: ArrayLike = 1e-6) -> Array:
  """Perceval token-level penalty: A = Â − α·abs(Â) on flagged tokens, Â elsewhere.

  A perception process reward model returns the spans of a response it judges
  hallucinated; the loop turns them into `flag_mask`. Flagged tokens get less credit in a
  correct response and more blame in a wrong one::

    Â_b = (R_b − μ_g) / (σ_g + ε)                    (GRPO, unbiased std)
    A[b,t] = M[b,t] · (Â_b − α · abs(Â_b) · F[b,t])

  The response's total credit changes (no renormalisation); for α ≤ 1 signs are kept (the
  code does not clip, and neither does this). All-equal groups give Â = 0 and no penalty.

  Paper: "Improving Vision-language Models with Perception-centric Process Reward Models"
  (Perceval), CVPR 2026, Eq. 3. α = 0.1 as in the authors' training scripts. A one-row group
  gives 0 (the code: the raw reward; `singleton="raw"`).

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    flag_mask: [B,T] bool, tokens inside flagged spans (ignored outside `response_mask`).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    penalty: α, the fraction of abs(Â) taken off flagged tokens.
    group_std: static, "unbiased" (code) | "population" | "none".
    singleton: static, "zero" | "raw".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> flags = np.zeros((4, 4), bool); flags[0, 1:3] = True; flags[1, 3] = True
    >>> a = perceval_advantages(reward=np.array([1., 0., 1., 0.]), group_id=np.zeros(4, np.int32),
    ...                         response_mask=np.ones((4, 4), bool), flag_mask=flags,
    ...                         num_groups=1)
    >>> np.round(np.asarray(a[:2], np.float64), 4).tolist()
    [[0.866, 0.7794, 0.7794, 0.866], [-0.866, -0.866, -0.866, -0.9526]]
  """
  check_choice("perceval_advantages", "group_std", group_std, GROUP_STDS)
  check_choice("perceval_advantages", "singleton", singleton, SINGLETONS)
  rows = ops.group_rows("perceval_advantages", reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  flag_BT = jnp.asarray(flag_mask)
  chex.assert_rank(flag_BT, 2)
  chex.assert_equal_shape([flag_BT, rows.mask])
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps,
                             singleton=singleton)
  flag_BT = (flag_BT.astype(bool) & rows.mask).astype(jnp.float32)
  w_BT = signed_weights(adv_B, -flag_BT, rows.mask, alpha=penalty, clip=False)
  return redistribute(adv_B, jax.lax.stop_gradient(w_BT), rows.mask, renormalize=False)
