"""OPAC: a pessimistic latent per-token reward fitted to trajectory labels, with a group critic."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["OpacOutput", "latent_token_rewards", "opac_advantages"]

_PAPER = ("When Does Trajectory-Level Supervision Permit Efficient Offline Reinforcement "
          "Learning? (OPAC, pessimistic actor-critic from trajectory-level labels), arXiv preprint")


class OpacOutput(NamedTuple):
  """`advantages` [B,T]; the pessimistic latent rewards `token_reward` [B,T] and their
  `uncertainty` [B,T] (0 off mask); the fitted per-feature rewards `weights` [D]."""
  advantages: Array
  token_reward: Array
  uncertainty: Array
  weights: Array


def latent_token_rewards(*, reward: ArrayLike, response_mask: ArrayLike, tokens: ArrayLike,
                         valid: ArrayLike, feature_dim: int = 64, ridge: ArrayLike = 1.0,
                         pessimism: ArrayLike = 0.1) -> tuple[Array, Array, Array]:
  """Ridge fit of a linear per-token reward to trajectory labels, with its pessimistic bonus.

  Features are hashed token indicators φ_t = e_{y_t mod D}; a trajectory's features are
  their sum Φ_b = Σ_t φ_t (counts). Over the `valid` rows::

    Λ = Σ_b Φ_b Φ_bᵀ + λ I,    w = Λ⁻¹ Σ_b Φ_b R_b
    r̃_t = w·φ_t − β ‖φ_t‖_{Λ⁻¹} = w[k_t] − β √(Λ⁻¹)[k_t, k_t],   k_t = y_t mod D

  Args:
    reward: [B] float trajectory labels.
    response_mask: [B,T] bool tokens whose rewards are modelled.
    tokens: [B,T] int32 token ids.
    valid: [B] bool rows that enter the fit.
    feature_dim: static D, the number of hash buckets.
    ridge: λ > 0.
    pessimism: β ≥ 0, the weight of the uncertainty penalty.

  Returns:
    (r̃ [B,T], ‖φ_t‖_{Λ⁻¹} [B,T], w [D]) float32; zeros off `response_mask`.
  """
  check_int("latent_token_rewards", "feature_dim", feature_dim)
  mask_BT = jnp.asarray(response_mask, bool)
  tok_BT = jnp.asarray(tokens)
  chex.assert_equal_shape([mask_BT, tok_BT])
  chex.assert_type(tok_BT, int)
  valid_B = jnp.asarray(valid, bool)
  r_B = jnp.where(valid_B, jnp.asarray(reward, jnp.float32), 0.0)
  k_BT = jnp.mod(jnp.where(mask_BT, tok_BT.astype(jnp.int32), 0), feature_dim)
  b = mask_BT.shape[0]
  flat = (jnp.arange(b, dtype=jnp.int32)[:, None] * feature_dim + k_BT).reshape(-1)
  use_BT = mask_BT & valid_B[:, None]
  phi_BD = jax.ops.segment_sum(use_BT.reshape(-1).astype(jnp.float32), flat,
                               b * feature_dim).reshape(b, feature_dim)
  lam = jnp.asarray(ridge, jnp.float32)
  gram_DD = phi_BD.T @ phi_BD + lam * jnp.eye(feature_dim, dtype=jnp.float32)
  chol = jax.scipy.linalg.cho_factor(gram_DD, lower=True)
  w_D = jax.scipy.linalg.cho_solve(chol, phi_BD.T @ r_B)
  inv_diag_D = jnp.diagonal(jax.scipy.linalg.cho_solve(chol, jnp.eye(feature_dim,
                                                                    dtype=jnp.float32)))
  unc_D = jnp.sqrt(jnp.maximum(inv_diag_D, 0.0))
  unc_BT = jnp.where(mask_BT, unc_D[k_BT], 0.0)
  r_BT = jnp.where(mask_BT, w_D[k_BT] - jnp.asarray(pessimism, jnp.float32) * unc_BT, 0.0)
  return r_BT, unc_BT, w_D


@register_estimator("opac", needs=("reward", "group_id", "response_mask", "tokens"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size",
                                                   "feature_dim"),
                    returns_output=True, confidence="inferred",
                    source=_PAPER + " (abstract: a pessimistic actor-critic that learns a "
                    "latent reward model from trajectory-level labels; no released code was "
                    "found)")
def opac_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    tokens: ArrayLike, num_groups: int, group_size: int | None = None,
                    feature_dim: int = 64, ridge: float = 1.0,
                    pessimism: float = 0.1) -> OpacOutput:
  """OPAC for logged text rollouts: latent per-token rewards from trajectory labels, pessimistic,
  with a Monte-Carlo critic baselined per group and position.

  OPAC learns from datasets where each trajectory carries one scalar label whose mean is the
  return: it fits a latent per-step reward model to the labels, subtracts an uncertainty
  penalty (pessimism: act only where the data support the reward) and runs an actor-critic
  on the result. For a batch of logged responses with labels R_b (the batch is the dataset;
  nothing is kept between calls)::

    r̃_t   = w·φ_t − β ‖φ_t‖_{Λ⁻¹}                  (`latent_token_rewards`: ridge, Σ_t r_t ≈ R)
    G̃_t   = Σ_{t' ≥ t} r̃_t'                         (critic: return-to-go of the latent rewards)
    V_g,t = mean of G̃_t over the rows of group g with a token at t
    A_t   = G̃_t − V_g,t

  The features φ_t are hashed token indicators (token id mod D), so w holds one latent
  reward per bucket and ‖φ_t‖_{Λ⁻¹} = √(Λ⁻¹)_kk shrinks as a bucket is seen more often. A
  group of one valid row gets 0; rows without tokens take no part in the fit.

  Paper: "When Does Trajectory-Level Supervision Permit Efficient Offline Reinforcement
  Learning?" (OPAC), arXiv preprint.

  What differs from the paper: OPAC is a statistical-theory algorithm for offline MDPs with
  general function classes and a high-probability pessimistic critic; its preference-label
  and generalized (nonlinear aggregation) variants are left out. Here the latent reward class
  is linear in hashed token indicators with a ridge fit and the elliptical bonus (the linear
  instance of pessimism), the critic is the Monte-Carlo return-to-go of the pessimistic
  rewards, and the value baseline is the group's mean at the same position (prompts share
  their first state). The abstract gives no formulas: all three are this library's reading.

  Args:
    reward: [B] float trajectory labels.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool policy tokens.
    tokens: [B,T] int32 token ids; only those under `response_mask` are features.
    num_groups: static number of groups.
    group_size: static G for contiguous groups (the same numbers as the segment path).
    feature_dim: static D, the number of hash buckets of the latent reward model.
    ridge: λ > 0, the ridge of the fit.
    pessimism: β ≥ 0, the weight of the uncertainty penalty (0: no pessimism).

  Returns:
    OpacOutput(advantages [B,T], token_reward [B,T], uncertainty [B,T], weights [D]).

  Example:
    >>> import numpy as np
    >>> out = opac_advantages(reward=np.array([1., 0]), group_id=np.zeros(2, np.int32),
    ...                       response_mask=np.ones((2, 2), bool),
    ...                       tokens=np.array([[1, 2], [1, 3]], np.int32), num_groups=1,
    ...                       feature_dim=4, pessimism=0.0)
    >>> np.round(np.asarray(out.weights, np.float64), 4).tolist()
    [0.0, 0.25, 0.375, -0.125]
    >>> np.round(np.asarray(out.advantages, np.float64), 4).tolist()
    [[0.25, 0.25], [-0.25, -0.25]]
  """
  _, gid_B, mask_BT, valid_B = ops.group_rows(
      "opac_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  r_BT, unc_BT, w_D = latent_token_rewards(
      reward=reward, response_mask=mask_BT, tokens=tokens, valid=valid_B,
      feature_dim=feature_dim, ridge=ridge, pessimism=pessimism)
  ret_BT = ops.prefix_sum(r_BT, reverse=True)
  on_BT = mask_BT & valid_B[:, None]
  seg_B = jnp.where(valid_B, gid_B, num_groups)
  tot_ST = jax.ops.segment_sum(jnp.where(on_BT, ret_BT, 0.0), seg_B, num_groups + 1)
  cnt_ST = jax.ops.segment_sum(on_BT.astype(jnp.float32), seg_B, num_groups + 1)
  base_BT = tot_ST[seg_B] / jnp.maximum(cnt_ST[seg_B], 1.0)
  adv_BT = jnp.where(on_BT, ret_BT - base_BT, 0.0)
  return OpacOutput(advantages=adv_BT, token_reward=jnp.where(on_BT, r_BT, 0.0),
                    uncertainty=jnp.where(on_BT, unc_BT, 0.0), weights=w_D)
