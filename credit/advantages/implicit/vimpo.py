"""VIMPO: values implied by the policy's log-ratio to the reference (KL-regularised optimum)."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["VimpoOutput", "vimpo_advantages"]

_PAPER = "VIMPO: policy-implied value from KL-regularised optimality, arXiv 2606.20008"


class VimpoOutput(NamedTuple):
  """advantages: [B,T] stop-gradient actor advantages; value_loss: scalar terminal
  consistency loss (differentiable in `logprob`); values: [B,T] implied values V_t
  (stop-gradient), zero outside the mask."""
  advantages: Array
  value_loss: Array
  values: Array


@register_estimator("vimpo",
                    needs=("reward", "group_id", "response_mask", "logprob", "logprob_ref"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size"),
                    returns_output=True)
def vimpo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                     response_mask: ArrayLike, logprob: ArrayLike, logprob_ref: ArrayLike,
                     num_groups: int, group_size: int | None = None, beta: ArrayLike = 0.1,
                     clip: ArrayLike = 10.0) -> VimpoOutput:
  """VIMPO: the implied value V_t = b_g + β Σ_{s<t} ℓ_s, its advantage and value loss.

  Paper: VIMPO, arXiv 2606.20008 (`shared/methods/token_and_implicit.md` §14). In a token
  MDP whose optimum is KL-regularised, β log(π*/π_ref)(a_t|s_t) = r_t + V(s_{t+1}) − V(s_t);
  with no intermediate reward and V(s_T) = 0 the value of every prefix follows from the
  log-ratios, a squared terminal-consistency loss injects the outcome R, and the actor
  advantage comes for free.

  Confidence: inferred (from the abstract and summaries: terminal condition V(s_T) = 0,
  squared value loss, PPO actor). The formulas below, the anchor and the clip are the
  spec's derivation (ours), not the paper's equations. With ℓ_t = log π(y_t) − log
  π_ref(y_t) on valid tokens and b_g the mean reward of the row's group:

  .. math::
    V_t = b_g + clip(β Σ_{s<t} ℓ_s, −C, C)
    A_t = R − V_t                                    (stop-gradient)
    L_V = mean_b ( clip(β Σ_t ℓ_{b,t}, −C, C) + b_g − R_b )²

  Use `advantages` with a PPO-clip policy loss and add c_V·`value_loss` (c_V = 1, ours);
  the gradient of `value_loss` flows into `logprob` only.

  Choices (ours): b_g is the critic-free anchor V_0 (a singleton group has b = R, so
  A = −clip(β Σ_{s<t} ℓ)); rows that are empty or outside [0, num_groups) get zeros and
  take no part in b_g or in the mean of L_V; sums over time skip masked positions.
  Because the advantage depends on the log-ratio, equal outcomes in a group do not give
  zero advantages.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids in [0, num_groups); may be None with `group_size`.
    response_mask: [B,T] bool.
    logprob: [B,T] float current policy log-prob of the sampled token (differentiated).
    logprob_ref: [B,T] float reference log-prob (stop-gradient).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    beta: β of the KL regularisation (0.1, ours).
    clip: C, bound on |β Σ ℓ| (10, ours).

  Returns:
    `VimpoOutput(advantages [B,T], value_loss scalar, values [B,T])`.

  >>> import numpy as np
  >>> out = vimpo_advantages(reward=np.array([1., 0.]), group_id=np.zeros(2, np.int32),
  ...                        response_mask=np.ones((2, 3), bool),
  ...                        logprob=np.array([[.5, -.2, .1], [-.3, 0., .2]], np.float32),
  ...                        logprob_ref=np.zeros((2, 3), np.float32), num_groups=1)
  >>> np.round(np.asarray(out.advantages, np.float64), 3).tolist()
  [[0.5, 0.45, 0.47], [-0.5, -0.47, -0.47]]
  >>> round(float(out.value_loss), 5)
  0.22585
  """
  fn = "vimpo_advantages"
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      fn, reward, group_id, num_groups, group_size, response_mask=response_mask)
  lp_BT = jnp.asarray(logprob, jnp.float32)
  ref_BT = jnp.asarray(logprob_ref, jnp.float32)
  chex.assert_equal_shape([lp_BT, ref_BT, mask_BT])
  tok_BT = mask_BT & valid_B[:, None]
  ell_BT = jnp.where(tok_BT, lp_BT - jax.lax.stop_gradient(ref_BT), 0.0)
  b = jnp.asarray(beta, jnp.float32)
  c = jnp.asarray(clip, jnp.float32)
  mom = ops.group_moments_rows(reward_B, gid_B, valid_B, num_groups, group_size)
  base_B = jnp.where(valid_B, mom.mean, 0.0)
  # Σ_{s<t} ℓ_s: exclusive prefix sum (masked positions add nothing).
  total_BT = jnp.cumsum(ell_BT, axis=-1)
  before_BT = total_BT - ell_BT
  values_BT = base_B[:, None] + jnp.clip(b * before_BT, -c, c)
  values_BT = jax.lax.stop_gradient(jnp.where(tok_BT, values_BT, 0.0))
  adv_BT = jnp.where(tok_BT, reward_B[:, None] - values_BT, 0.0)
  resid_B = jnp.clip(b * total_BT[:, -1], -c, c) + base_B - reward_B
  w_B = valid_B.astype(jnp.float32)
  value_loss = jnp.sum(jnp.where(valid_B, jnp.square(resid_B), 0.0)) / jnp.maximum(
      jnp.sum(w_B), 1.0)
  return VimpoOutput(advantages=jax.lax.stop_gradient(adv_BT), value_loss=value_loss,
                     values=values_BT)
