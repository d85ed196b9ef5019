"""DRO: policy gradient with a quadratic penalty on the log-ratio to the behaviour policy."""
from __future__ import annotations

import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["dro_loss"]


@policy_loss("dro", "DRO: Offline Regularised RL for LLM Alignment (Direct Reward "
             "Optimization), arXiv 2405.19107; Kimi k1.5, arXiv 2501.12599",
             confidence="paper-equation",
             source=("DRO, arXiv 2405.19107; Kimi k1.5, arXiv 2501.12599 (its regulariser); the "
                     "loss formula Thinking Machines' Tinker documents"))
def dro_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
             response_mask: ArrayLike, beta: ArrayLike = 1.0) -> TokenLoss:
  """DRO: policy gradient with a quadratic penalty on the log-ratio to the behaviour policy.

  ::

    ℓ = −(A log π − ½ β (log π − log π_old)²)

  "DRO" is Direct Reward Optimization ("Offline Regularised Reinforcement Learning for
  Large Language Models Alignment", arXiv 2405.19107) in the policy-gradient form of Kimi
  k1.5 (arXiv 2501.12599, its ½τ(log π/π_old)² regulariser), as Thinking Machines' Tinker
  documents its `dro` loss. Not "Direct Reasoning Optimization" nor distributionally
  robust optimisation. DRO's soft advantage (reward minus a learned soft value) is
  computed outside the loss. β = 1 by default (Tinker's example uses 0.05); the log-ratio
  in the penalty is clamped to ±20.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 behaviour log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    beta: β ≥ 0, strength of the quadratic penalty.

  Returns:
    TokenLoss; metrics `penalty_mean` (mean of ½δ²).

  Example:
    >>> import numpy as np
    >>> out = dro_loss(logprob=np.log([[0.5, 0.9]]), logprob_old=np.log([[0.25, 0.9]]),
    ...                advantages=np.array([[1., -1.]]), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()   # 0.693 + ½ (log 2)²
    [[0.933374, -0.105361]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  pen = 0.5 * jnp.square(x.delta)
  return TokenLoss(-(x.adv * x.lp - beta * pen), {"penalty_mean": pen})
