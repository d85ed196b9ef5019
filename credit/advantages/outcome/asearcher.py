"""ASearcher: shifted, scaled, clipped outcome reward, normalised over the batch's tokens."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["asearcher_advantages"]

_FN = "asearcher_advantages"
_PAPER = ("ASearcher: Beyond Ten Turns: Unlocking Long-Horizon Agentic Search with Large-Scale "
          "Asynchronous RL, arXiv 2508.07976; trainer: AReaL, arXiv 2505.24298")


def _is_num(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check(reward_scaling, reward_clip, eps) -> None:
  if _is_num(reward_scaling) and reward_scaling <= 0:
    raise ValueError(f"{_FN}: reward_scaling must be > 0, got {reward_scaling}")
  if _is_num(reward_clip) and reward_clip <= 0:
    raise ValueError(f"{_FN}: reward_clip must be > 0 (the bound |r'| ≤ reward_clip), "
                     f"got {reward_clip}")
  if _is_num(eps) and eps < 0:
    raise ValueError(f"{_FN}: eps must be >= 0, got {eps}")


@register_estimator("asearcher", needs=("reward", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "adv_norm", "group_adv_norm",
                                     "std_norm", "std_unbiased"),
                    optional_needs={"group_id": "group_adv_norm"})
def asearcher_advantages(*, reward: ArrayLike, response_mask: ArrayLike,
                         group_id: ArrayLike | None = None, num_groups: int | None = None,
                         group_size: int | None = None, reward_bias: ArrayLike = -0.5,
                         reward_scaling: ArrayLike = 10.0, reward_clip: ArrayLike = 20.0,
                         adv_norm: bool = True, group_adv_norm: bool = False,
                         std_norm: bool = True, std_unbiased: bool = False,
                         eps: ArrayLike = 1e-5) -> Array:
  """ASearcher / AReaL outcome advantages: r' = clip((r + b)·s, ±c), token-weighted z-score.

  .. math::
    r'_i = clip((r_i + b)·s, −c, c)          (b = −0.5, s = 10, c = 20: r ∈ {0,1} → ∓5)
    A_{i,t} = r'_i                            (no critic, γ = λ = 1, no KL: the return)
    μ = Σ_{i,t} M r'_i / Σ M,   σ² = Σ_{i,t} M (r'_i − μ)² / Σ M      (population)
    Â_{i,t} = M_{i,t} (r'_i − μ) / (σ + ε)    (ε = 1e-5 added to σ)

  The statistics run over every response token of the batch (`response_mask`, which in
  multi-turn rollouts excludes tool output), so a row weighs by its length. There is no
  per-prompt baseline in ASearcher's setting: the batch mean is the only baseline.

  Confidence: code-verified. inclusionAI/ASearcher, `AReaL/ASearcher/configs/*.yaml`
  (`reward_bias: -0.5`, `reward_scaling: 10.0`, `group_adv_norm: false`, `kl_ctl: 0.0`;
  defaults from `AReaL/areal/api/cli_args.py`: `reward_clip` 20, `discount` 1,
  `gae_lambda` 1, `adv_norm` true) and `AReaL/areal/engine/ppo/actor.py`
  `PPOActor.compute_advantages` (reward transform, reward at the last token, GAE with zero
  values, then `masked_normalization(advantages, loss_mask)`, i.e.
  `AReaL/areal/utils/functional.py` `masked_normalization`: population variance
  E[x²] − μ², `(x − μ)/(σ + 1e-5)`). `group_adv_norm` slices contiguous groups of
  `group_size` there and normalises each with the same function; `std_norm=False` and
  `std_unbiased` follow newer AReaL's `NormConfig` (`std_level=None`, `std_unbiased`;
  `areal/utils/data.py` `Normalization`, where an unbiased std over ≤ 1 token is 1).
  Spec: distill_and_structure.md C1 and its corrections. Not carried over:
  `group_reward_norm` (off in ASearcher), `mask_no_eos_with_zero` (off), the KL reward
  (`kl_ctl` 0) and a critic.

  Partial groups: the default needs no groups at all, so asynchronous batches holding
  incomplete groups are fine. With `group_adv_norm` the statistics of a group are over
  the rows of it that are present and valid; a group with one valid row (or all rows
  equal) gets exact zeros (its tokens all equal their mean), as in the code.

  Args:
    reward: [B] outcome rewards r.
    response_mask: [B,T] bool; rows with no token get zeros and take no part in any
      statistic.
    group_id: [B] int group ids; only read with `group_adv_norm` on the segment path
      (`group_size=None`).
    num_groups: static number of groups (required with `group_adv_norm`).
    group_size: static G of the contiguous [N,G] fast path (with `group_adv_norm`).
    reward_bias, reward_scaling, reward_clip: b, s > 0, c > 0 of the transform (AReaL
      `reward_bias`, `reward_scaling`, `reward_clip`; ASearcher −0.5, 10, 20).
    adv_norm: static; normalise over the whole batch (AReaL `adv_norm`). With both
      `adv_norm` and `group_adv_norm` False the result is r' on every response token.
    group_adv_norm: static; normalise within each prompt group instead (AReaL
      `group_adv_norm`; switches on the `group_id` input).
    std_norm: static; False only centres (AReaL `NormConfig.std_level=None`: mean-only).
    std_unbiased: static; Bessel-corrected σ over the tokens (AReaL `std_unbiased`;
      ASearcher: False).
    eps: ε ≥ 0 added to σ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Raises:
    ValueError: reward_scaling ≤ 0, reward_clip ≤ 0, eps < 0, or `group_adv_norm` without
      a valid `num_groups` (or `group_id` on the segment path).

  >>> import numpy as np
  >>> m = np.array([[1, 1, 0], [1, 1, 1]], bool)
  >>> a = asearcher_advantages(reward=np.array([1., 0.]), response_mask=m)
  >>> np.round(np.asarray(a, np.float64), 4).tolist()
  [[1.2247, 1.2247, 0.0], [-0.8165, -0.8165, -0.8165]]
  """
  _check(reward_scaling, reward_clip, eps)
  reward_B = jnp.asarray(reward, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, mask_BT], [1, 2])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  r_B = jnp.clip((reward_B + reward_bias) * reward_scaling, -reward_clip, reward_clip)
  if group_adv_norm:
    _, gid_B, mask_BT, valid_B = ops.group_rows(_FN, r_B, group_id, num_groups, group_size,
                                                response_mask=mask_BT)

    def pool(x_B, op="sum"):  # op over the valid rows of each row's group, [B]
      return ops.group_reduce_rows(x_B, gid_B, valid_B, num_groups, group_size, op)
  else:
    mask_BT = mask_BT.astype(bool)
    valid_B = jnp.any(mask_BT, axis=-1)

    def pool(x_B, op="sum"):  # op over all valid rows, broadcast to [B]
      fill = 0.0 if op == "sum" else -jnp.inf
      red = getattr(jnp, op)(jnp.where(valid_B, x_B, fill))
      return jnp.broadcast_to(red, x_B.shape)
  r_B = jnp.where(valid_B, r_B, 0.0)
  if not (adv_norm or group_adv_norm):
    return ops.broadcast_to_tokens(r_B, mask_BT)
  w_B = jnp.where(valid_B, ops.sequence_lengths(mask_BT), 0.0)  # tokens per row
  # Shift by the (group) maximum first, so equal rewards centre to exact zeros.
  piv_B = jax.lax.stop_gradient(pool(r_B, "max"))
  d_B = jnp.where(valid_B, r_B - jnp.where(jnp.isfinite(piv_B), piv_B, 0.0), 0.0)
  n_B = pool(w_B)
  c_B = jnp.where(valid_B, d_B - pool(w_B * d_B) / jnp.maximum(n_B, 1.0), 0.0)
  if std_norm:
    den_B = n_B - 1.0 if std_unbiased else n_B
    var_B = pool(w_B * c_B * c_B) / jnp.maximum(den_B, 1.0)
    std_B = jnp.where(den_B > 0, ops.safe_sqrt(var_B), 1.0)
    scale_B = std_B + jnp.asarray(eps, jnp.float32)
    c_B = jnp.where(scale_B > 0, c_B / jnp.where(scale_B > 0, scale_B, 1.0), 0.0)
  return ops.broadcast_to_tokens(jnp.where(valid_B, c_B, 0.0), mask_BT)
