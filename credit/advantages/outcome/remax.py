"""ReMax: the reward of the greedy response to the same prompt is the baseline."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["remax_advantages"]

_PAPER = ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning "
          "Large Language Models, arXiv 2310.10505")


@register_estimator("remax", needs=("reward", "reward_baseline", "response_mask"), paper=_PAPER,
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py "
                            "compute_remax_outcome_advantage"))
def remax_advantages(*, reward: ArrayLike, reward_baseline: ArrayLike,
                     response_mask: ArrayLike) -> Array:
  """ReMax: the reward of the greedy response to the same prompt is the baseline.

  ::

    A[i,t] = (R(x, y_i) − R(x, ŷ_i)) · M[i,t]

  with ŷ_i the greedy decode of row i's prompt (an extra greedy rollout and its reward,
  which the runner produces as `reward_baseline`).

  Paper: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
  Aligning Large Language Models", arXiv 2310.10505, Algorithm 1. verl takes the reverse
  cumulative sum of the last-token outcome minus the baseline, which equals R_i − b_i on
  every valid token.

  Args:
    reward: [B] rewards of the sampled responses.
    reward_baseline: [B] reward of the greedy response to the same prompt.
    response_mask: [B,T] bool.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = remax_advantages(reward=np.array([1., 0.]), reward_baseline=np.array([0., 0.]),
    ...                      response_mask=np.ones((2, 2), bool))
    >>> np.asarray(a).tolist()
    [[1.0, 1.0], [0.0, 0.0]]
  """
  reward_B = jnp.asarray(reward, jnp.float32)
  base_B = jnp.asarray(reward_baseline, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, base_B, mask_BT], [1, 1, 2])
  chex.assert_equal_shape([reward_B, base_B])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  return ops.broadcast_to_tokens(reward_B - base_B, mask_BT)
