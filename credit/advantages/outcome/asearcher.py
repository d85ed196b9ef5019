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
                    optional_needs={"group_id": "group_adv_norm"},
                    confidence="code-verified",
                    source=(_PAPER + "; code: inclusionAI/ASearcher AReaL/ASearcher/configs, "
                            "AReaL/areal/engine/ppo/actor.py "
                            "PPOActor.compute_advantages, "
                            "AReaL/areal/utils/functional.py masked_normalization"))
def asearcher_advantages(*, reward: ArrayLike, response_mask: ArrayLike,
                         group_id: ArrayLike | None = None, num_groups: int | None = None,
                         group_size: int | None = None, reward_bias: ArrayLike = -0.5,
                         reward_scaling: ArrayLike = 10.0, reward_clip: ArrayLike = 20.0,
                         adv_norm: bool = True, group_adv_norm: bool = False,
                         std_norm: bool = True, std_unbiased: bool = False,
                         eps: ArrayLike = 1e-5) -> Array:
  """ASearcher / AReaL outcome advantages: a shifted, scaled, clipped reward, whitened over tokens.

  ::

    r'_i = clip((r_i + b) s, −c, c)           (b = −0.5, s = 10, c = 20: r ∈ {0, 1} → ∓5)
    μ, σ² = mean and population variance of r' over every response token of the batch
    A[i,t] = M[i,t] (r'_i − μ) / (σ + ε)

  There is no critic (γ = λ = 1 and zero values make the return r'), no KL reward and no
  per-prompt baseline: the batch mean is the baseline, and a row weighs by its length.
  With no groups needed, asynchronous batches holding incomplete groups are fine.
  `group_adv_norm` normalises within each group instead; `std_norm=False` only centres.

  Paper: "Beyond Ten Turns: Unlocking Long-Horizon Agentic Search with Large-Scale
  Asynchronous RL" (ASearcher), arXiv 2508.07976; its trainer AReaL, arXiv 2505.24298.
  Settings as ASearcher's configs; AReaL's `group_reward_norm`, `mask_no_eos_with_zero`
  (both off there), the KL reward and the critic are not carried over.

  Args:
    reward: [B] outcome rewards r.
    response_mask: [B,T] bool; rows with no token get zeros and no part in any statistic.
    group_id: [B] int group ids; read only with `group_adv_norm` on the segment path.
    num_groups: static number of groups (required with `group_adv_norm`).
    group_size: static G of the contiguous [N,G] path (with `group_adv_norm`).
    reward_bias: b.
    reward_scaling: s > 0.
    reward_clip: c > 0.
    adv_norm: static; whiten over the whole batch. With `group_adv_norm` also False the
      result is r' on every response token.
    group_adv_norm: static; whiten within each prompt group instead.
    std_norm: static; False only centres.
    std_unbiased: static; Bessel-corrected σ over the tokens.
    eps: ε ≥ 0 added to σ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
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
