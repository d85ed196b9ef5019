"""PPO's generalised advantage estimate (critic baseline), skipping masked tokens."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.outcome._common import is_one, token_rewards
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["GAEOutput", "gae_advantages"]

_PAPER = ("High-Dimensional Continuous Control Using Generalized Advantage Estimation, "
          "arXiv 1506.02438")


class GAEOutput(NamedTuple):
  """`advantages` [B,T] (whitened unless asked otherwise) and value targets `returns` [B,T]."""
  advantages: Array
  returns: Array


@register_estimator("gae", needs=("reward", "values", "response_mask"), paper=_PAPER,
                    static_argnames=("whiten",), returns_output=True,
                    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"})
def gae_advantages(*, reward: ArrayLike, values: ArrayLike, response_mask: ArrayLike,
                   logprob_old: ArrayLike | None = None, logprob_ref: ArrayLike | None = None,
                   token_reward: ArrayLike | None = None, gamma: float = 1.0, lam: float = 1.0,
                   kl_coef: float = 0.0, whiten: bool = True) -> GAEOutput:
  """PPO's generalised advantage estimate with a critic, skipping masked tokens.

  Confidence: code-verified (verl `compute_gae_advantage_return`).

  Paper: "High-Dimensional Continuous Control Using Generalized Advantage
  Estimation", arXiv 1506.02438, eq. 16. Over valid positions only
  (`shared/methods/outcome_and_clipping.md` §5):

  .. math::
    δ_t = r_t + γ·V_{next valid} − V_t,    Â_t = δ_t + γλ·Â_{next valid}
    returns_t = Â_t + V_t,                  A = masked_whiten(Â, M)

  r_t is the outcome on the last valid token plus optional dense rewards minus
  the k1 KL-in-reward term β·(logprob_old − logprob_ref). Observation tokens
  (M=0) carry V_next and the running Â through unchanged; the value after the
  last valid token is 0. verl's multi-turn version skips observation tokens the
  same way; here with `ops.next_valid_value` and `ops.discounted_reverse_cumsum`
  instead of a loop. For Python `gamma == lam == 1` (verl's default) the sum
  telescopes to Â_t = G_t − V_t (G the reward-to-go), computed without any scan.

  Args:
    reward: [B] outcome rewards.
    values: [B,T] critic values at each position (masked positions ignored).
    response_mask: [B,T] bool.
    logprob_old, logprob_ref, token_reward, kl_coef: as `reinforce_pp_advantages`.
    gamma, lam: discount and GAE λ (may be traced).
    whiten: static; whiten the advantages over all valid tokens (verl does).

  Returns:
    GAEOutput(advantages [B,T], returns [B,T]); both zero outside the mask.

  >>> import numpy as np
  >>> out = gae_advantages(reward=np.array([1.]), values=np.array([[.5, .6, .8]]),
  ...                      response_mask=np.ones((1, 3), bool), lam=.95, whiten=False)
  >>> [np.round(np.asarray(x, np.float64), 4).tolist() for x in out]
  [[[0.4705, 0.39, 0.2]], [[0.9705, 0.99, 1.0]]]
  """
  reward_B = jnp.asarray(reward, jnp.float32)
  values_BT = jnp.asarray(values, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, values_BT, mask_BT], [1, 2, 2])
  chex.assert_equal_shape([values_BT, mask_BT])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  mask_BT = mask_BT.astype(bool)
  x_BT = token_rewards("gae_advantages", reward_B, mask_BT, logprob_old, logprob_ref,
                       token_reward, kl_coef)
  values_BT = jnp.where(mask_BT, values_BT, 0.0)
  if is_one(gamma) and is_one(lam):
    # γ = λ = 1 (verl's default): the TD errors telescope, Â_t = G_t − V_t exactly.
    if x_BT is None:   # outcome only: G_t = R on every valid token
      returns_BT = ops.broadcast_to_tokens(reward_B, mask_BT)
    else:
      returns_BT = ops.discounted_reverse_cumsum(x_BT, mask_BT, 1.0)
    adv_BT = jnp.where(mask_BT, returns_BT - values_BT, 0.0)
  else:
    if x_BT is None:
      x_BT = ops.outcome_to_token_rewards(reward_B, mask_BT)
    g = jnp.asarray(gamma, jnp.float32)
    delta_BT = x_BT + g * ops.next_valid_value(values_BT, mask_BT) - values_BT
    adv_BT = ops.discounted_reverse_cumsum(delta_BT, mask_BT,
                                           g * jnp.asarray(lam, jnp.float32))
    returns_BT = jnp.where(mask_BT, adv_BT + values_BT, 0.0)
  if whiten:
    adv_BT = ops.masked_whiten(adv_BT, mask_BT)
  return GAEOutput(advantages=adv_BT, returns=returns_BT)
