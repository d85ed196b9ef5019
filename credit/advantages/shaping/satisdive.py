"""SatisDive's satisficing group objective: reward up to a group cutoff, diversity above it."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.shaping import _behaviour
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["group_reward_cutoff", "satisdive_advantages"]

_PAPER = ("Traversing the Satisfaction-Diversity Frontier in Text-to-Image Diffusion "
          "(SatisDive), arXiv preprint")


def group_reward_cutoff(reward_B: Array, group_id: Array, valid_B: Array, num_groups: int,
                        quantile: ArrayLike) -> Array:
  """The `quantile` of the valid rewards of each row's group, linearly interpolated between
  order statistics (numpy's default), gathered to rows [B]; 0 for invalid rows.

  One lexicographic sort on (group, reward): O(B log B), the same on both group paths.
  """
  seg_B = jnp.where(valid_B, group_id, num_groups)
  order = jnp.lexsort((reward_B, seg_B))
  r_sorted = reward_B[order]
  count_S = jax.ops.segment_sum(valid_B.astype(jnp.int32), seg_B, num_groups + 1)
  start_S = jnp.cumsum(count_S) - count_S
  safe = jnp.clip(seg_B, 0, num_groups)
  n_B, start_B = count_S[safe], start_S[safe]
  pos = jnp.clip(jnp.asarray(quantile, jnp.float32), 0.0, 1.0) * jnp.maximum(
      n_B - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos)
  w = pos - lo
  lo_i = lo.astype(jnp.int32)
  hi_i = jnp.minimum(lo_i + 1, jnp.maximum(n_B - 1, 0))
  last = reward_B.shape[0] - 1
  r_lo = r_sorted[jnp.clip(start_B + lo_i, 0, last)]
  r_hi = r_sorted[jnp.clip(start_B + hi_i, 0, last)]
  return jnp.where(valid_B, r_lo + w * (r_hi - r_lo), 0.0)


@register_estimator("satisdive", needs=("reward", "group_id", "response_mask", "tokens"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size", "scale",
                                                   "descriptor_dim"),
                    confidence="inferred",
                    source=_PAPER + " (abstract: the satisficing formulation, a batch-relative "
                    "reward cutoff, reward improvement below it and diversity above it)")
def satisdive_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                         tokens: ArrayLike, num_groups: int, group_size: int | None = None,
                         cutoff_quantile: float = 0.5, diversity_coef: float = 1.0,
                         descriptor_dim: int = 64, scale: bool = True,
                         eps: float = 1e-6) -> Array:
  """SatisDive as a group advantage: satisficed reward below the cutoff, diversity above it.

  SatisDive treats the G candidates of one prompt as a batch that must *satisfice*: every
  candidate should clear a reward floor, and the candidates that clear it should differ from
  each other. A batch-relative cutoff splits the group; candidates below it are pushed to
  improve their reward, candidates above it are pushed apart. As a group advantage::

    c_g  = Quantile_q({R_j : j ∈ g})                  (the group's reward cutoff)
    R̃_i  = min(R_i, c_g)                              (reward counts up to the cutoff only)
    A^R_i = (R̃_i − mean_g R̃) / (std_g R̃ + ε)          (GRPO on the satisficed reward)
    S_g  = {j ∈ g : R_j ≥ c_g}                        (the satisfied candidates)
    d_i  = mean_{j ∈ S_g, j ≠ i} ‖φ_i − φ_j‖₂           (i ∈ S_g; 0 when |S_g| < 2)
    A_i  = A^R_i + λ · 1[i ∈ S_g] · (d_i − mean_{j ∈ S_g} d_j)

  φ is a response's behaviour descriptor: its token-frequency vector hashed into D buckets
  (token id mod D). Below the cutoff only reward matters; above it extra reward earns
  nothing and a candidate gains by being far from the other satisfied ones. Rows with an
  empty response take no part; a group of one valid row gets 0; a group with all rewards
  equal has every row satisfied and gets the diversity term alone.

  Paper: "Traversing the Satisfaction-Diversity Frontier in Text-to-Image Diffusion"
  (SatisDive), arXiv preprint (no identifier recorded).

  What differs from the paper: SatisDive is a training-free inference-time method that
  steers a diffusion sampler (compared against FK steering) with a learned image reward and
  a perceptual distance (DreamSim). Only its objective is kept, turned into a policy-gradient
  advantage over a prompt's sampled responses: the diffusion guidance, the image reward and
  the image distance are left out (they need an image model), and the distance is the
  Euclidean distance of hashed token-frequency descriptors. The abstract gives no formula for
  the cutoff or the split: the group quantile (`cutoff_quantile`), the clipped reward
  min(R, c) and the centred mean distance are this library's reading.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool policy tokens.
    tokens: [B,T] int32 tokens; only those under `response_mask` enter the descriptors.
    num_groups: static number of groups.
    group_size: static G for contiguous groups (the same numbers as the segment path).
    cutoff_quantile: q in [0, 1], the group quantile that sets the cutoff (0 makes every
      candidate satisfied: pure diversity; 1 only the best: pure GRPO on the reward).
    diversity_coef: λ, the weight of the diversity term.
    descriptor_dim: static D, the number of hash buckets of the descriptors.
    scale: static; divide the reward term by the group std (GRPO) or not (Dr.GRPO).
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> tokens = np.array([[5, 5], [5, 6], [7, 7], [8, 8]], np.int32)
    >>> adv = satisdive_advantages(
    ...     reward=np.array([0., 1., 1., 1.]), group_id=np.zeros(4, np.int32),
    ...     response_mask=np.ones((4, 2), bool), tokens=tokens, num_groups=1)
    >>> np.round(np.asarray(adv[:, 0], np.float64), 4).tolist()
    [-1.5, 0.4368, 0.5316, 0.5316]
  """
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "satisdive_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  tok_BT = jnp.asarray(tokens)
  chex.assert_equal_shape([tok_BT, mask_BT])
  desc_BD = _behaviour.token_descriptors(tok_BT, mask_BT, descriptor_dim)
  reward_B = jnp.where(valid_B, reward_B, 0.0)
  cut_B = group_reward_cutoff(reward_B, gid_B, valid_B, num_groups, cutoff_quantile)
  sat_r_B = jnp.minimum(reward_B, cut_B)
  adv_r_B = ops.group_normalize(sat_r_B, gid_B, num_groups, valid=valid_B, scale=scale,
                                eps=eps, group_size=group_size)
  sat_B = valid_B & (reward_B >= cut_B)
  b = reward_B.shape[0]
  peers_BB = ((gid_B[:, None] == gid_B[None, :]) & sat_B[:, None] & sat_B[None, :]
              & ~jnp.eye(b, dtype=bool))
  dist_BB = _behaviour.pair_distances(desc_BD, desc_BD[None])
  n_peer_B = jnp.sum(peers_BB, axis=-1)
  d_B = jnp.sum(jnp.where(peers_BB, dist_BB, 0.0), axis=-1) / jnp.maximum(n_peer_B, 1)
  d_B = jnp.where(n_peer_B > 0, d_B, 0.0)
  div_B = ops.group_normalize(d_B, gid_B, num_groups, valid=sat_B, scale=False,
                              group_size=group_size)
  adv_B = adv_r_B + jnp.asarray(diversity_coef, jnp.float32) * div_B
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
