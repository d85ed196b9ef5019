"""GDPO: per-component group normalisation, weighted sum, then batch normalisation."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import grpo_scalar
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["gdpo_advantages"]

_PAPER = ("GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL "
          "Optimization, arXiv 2601.05242")
_BATCH_NORMS = ("token", "sequence", "none")


@register_estimator("gdpo", needs=("reward_components", "group_id", "response_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "batch_norm", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: NVlabs/GDPO verl-GDPO ray_trainer.py "
                            "(batch_norm='token')"))
def gdpo_advantages(*, reward_components: ArrayLike, group_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, group_size: int | None = None,
                    weights: ArrayLike | None = None,
                    batch_norm: Literal["token", "sequence", "none"] = "token",
                    eps: float = 1e-6, singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GDPO: normalise each reward component per group, sum, then normalise the batch.

  With several reward functions, a z-score per component keeps one component's scale from
  swamping the others::

    A_k[i] = (r_k[i] − μ_{g,k}) / (σ_{g,k} + ε)     (GRPO, per component k)
    s_i    = Σ_k w_k A_k[i]
    A      = whiten(s)

  `batch_norm="token"` whitens the broadcast [B,T] array (every token counts, so long
  rows weigh more), as the authors' code does, computed in O(B); "sequence" whitens over
  rows (TRL's `normalize_then_sum`); "none" keeps s.

  Paper: "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward
  RL Optimization", arXiv 2601.05242.

  Args:
    reward_components: [B,R] float, one column per reward function.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    weights: optional [R] weights w_k (default 1).
    batch_norm: static, "token" | "sequence" | "none".
    eps: added to the stds.
    singleton: "zero" | "raw", per component.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = gdpo_advantages(reward_components=np.array([[1., 1], [0, 1], [1, 0], [0, 0]]),
    ...                     group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 2), bool),
    ...                     num_groups=1, batch_norm="sequence")
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [1.2247, 0.0, 0.0, -1.2247]
  """
  check_choice("gdpo_advantages", "batch_norm", batch_norm, _BATCH_NORMS)
  check_choice("gdpo_advantages", "singleton", singleton, ops.SINGLETONS)
  comps_BR = jnp.asarray(reward_components, jnp.float32)
  chex.assert_rank(comps_BR, 2)
  _, gid_B, mask_BT, valid_B = ops.group_rows(
      "gdpo_advantages", comps_BR[:, 0], group_id, num_groups, group_size,
      response_mask=response_mask)
  norm_BR = jax.vmap(
      lambda r: grpo_scalar(r, gid_B, valid_B, num_groups, group_size, "group", eps, singleton),
      in_axes=1, out_axes=1)(comps_BR)
  if weights is None:
    s_B = jnp.sum(norm_BR, axis=1)
  else:
    w_R = jnp.asarray(weights, jnp.float32)
    chex.assert_shape(w_R, (comps_BR.shape[1],))
    s_B = jnp.sum(norm_BR * w_R[None, :], axis=1)
  s_B = jnp.where(valid_B, s_B, 0.0)
  if batch_norm == "token":
    len_B = jnp.where(valid_B, ops.sequence_lengths(mask_BT), 0.0)
    s_B = ops.weighted_whiten(s_B, len_B)
  elif batch_norm == "sequence":
    std = ops.safe_sqrt(ops.masked_var(s_B, valid_B))
    s_B = (s_B - ops.masked_mean(s_B, valid_B)) / (std + eps)
  return ops.broadcast_to_tokens(jnp.where(valid_B, s_B, 0.0), mask_BT)
