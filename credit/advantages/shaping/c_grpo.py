"""C-GRPO (CaRR): citation-aware rubric fraction blended with the outcome, then GRPO."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["c_grpo_advantages"]

_PAPER = ("CaRR: citation-aware rubric rewards for deep search agents (C-GRPO), THUDM, "
          "https://github.com/THUDM/CaRR")
_MODES = ("positive", "blend", "negative")


@register_estimator("c_grpo", needs=("reward", "rubric", "rubric_mask", "group_id",
                                     "response_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "mode",
                                     "normalize_in_positive", "normalize_rubric_reward",
                                     "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: THUDM/CaRR slime/slime/rollout/sglang_rollout.py "
                            "(the group reward blend), "
                            "deepsearch_rm_with_rubrics/launch_server.py (the rubric score), "
                            "scripts/training/training_run_4b-C-GRPO-rubric0.3.sh"))
def c_grpo_advantages(*, reward: ArrayLike, rubric: ArrayLike, rubric_mask: ArrayLike,
                      group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                      group_size: int | None = None, alpha: float = 0.3,
                      mode: Literal["positive", "blend", "negative"] = "positive",
                      normalize_in_positive: bool = False,
                      normalize_rubric_reward: bool = True, eps: float = 1e-6,
                      singleton: Literal["zero", "raw"] = "zero") -> Array:
  """C-GRPO: the rubric fraction, max-normalised per group, blended into the outcome; GRPO.

  A judge checks, for each rubric item of a deep-search question, whether the response
  identified the hidden entity, cited it and connected it to the answer::

    r_i = Σ_c rubric[i,c] m[i,c] / Σ_c m[i,c]       (0 when the row has no items)
    r̂_i = r_i / max_{j ∈ g} r_j                       (r_i when that max is 0)
    positive:  R_i = o_i if o_i = 0, else (1 − α) o_i + α r̃_i
    blend:     R_i = (1 − α) o_i + α r̂_i
    negative:  R_i = o_i if o_i > 0, else α r̂_i
    A = GRPO(R)

  In "positive" (the default) r̃ is the un-normalised r, as the released code does
  (`normalize_in_positive=True` uses r̂, the paper's description). With
  `normalize_rubric_reward=False` (the code's flag; on in its scripts) r̂ = r in every mode.
  A group with one valid row gives 0.

  Source: CaRR, citation-aware rubric rewards for deep search agents (THUDM). α = 0.3 as the
  released training script.

  Args:
    reward: [B] outcome o (1 correct, 0 wrong).
    rubric: [B,C] float judge score of each rubric item.
    rubric_mask: [B,C] bool items the prompt has.
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    alpha: rubric weight α.
    mode: static "positive" | "blend" | "negative".
    normalize_in_positive: static; blend r̂ rather than r in "positive" mode.
    normalize_rubric_reward: static; divide r by the group max.
    eps: added to σ.
    singleton: static "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> rub = np.array([[1., 1.], [1., 0.], [1., 1.], [0., 0.]])
    >>> a = c_grpo_advantages(reward=np.array([1., 1., 0., 0.]), rubric=rub,
    ...     rubric_mask=np.ones((4, 2), bool), group_id=np.zeros(4, np.int32),
    ...     response_mask=np.ones((4, 2), bool), num_groups=1)   # R = [1, .85, 0, 0]
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [0.9999, 0.7209, -0.8604, -0.8604]
  """
  fn = "c_grpo_advantages"
  check_choice(fn, "mode", mode, _MODES)
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  o_B, gid_B, mask_BT, valid_B = ops.group_rows(fn, reward, group_id, num_groups,
                                                group_size, response_mask=response_mask)
  rub_BC = jnp.asarray(rubric, jnp.float32)
  rm_BC = jnp.asarray(rubric_mask).astype(bool)
  chex.assert_rank([rub_BC, rm_BC], 2)
  chex.assert_equal_shape([rub_BC, rm_BC])
  chex.assert_equal_shape_prefix([rub_BC, o_B], 1)
  r_B = ops.masked_mean(rub_BC, rm_BC, axis=1)  # 0 with no rubric items
  r_B = jnp.where(valid_B, r_B, 0.0)
  max_B = ops.group_reduce_rows(r_B, gid_B, valid_B, num_groups, group_size, "max")
  max_B = jnp.where(valid_B, max_B, 0.0)
  rhat_B = jnp.where(max_B != 0, ops.safe_div(r_B, max_B), r_B)
  if not normalize_rubric_reward:
    rhat_B = r_B
  if mode == "positive":
    r_pos = rhat_B if normalize_in_positive else r_B
    R_B = jnp.where(o_B == 0, o_B, (1.0 - alpha) * o_B + alpha * r_pos)
  elif mode == "blend":
    R_B = (1.0 - alpha) * o_B + alpha * rhat_B
  else:
    R_B = jnp.where(o_B > 0, o_B, alpha * rhat_B)
  adv_B = ops.group_normalize(R_B, gid_B, num_groups, valid=valid_B, eps=eps,
                              singleton=singleton, group_size=group_size)
  return ops.broadcast_to_tokens(adv_B, mask_BT)
