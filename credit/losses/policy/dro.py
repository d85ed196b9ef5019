"""DRO: policy gradient with a quadratic penalty on the log-ratio to the behaviour policy."""
from __future__ import annotations

import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["dro_loss"]


@policy_loss("dro", "DRO: Offline Regularised RL for LLM Alignment (Direct Reward "
             "Optimization), arXiv 2405.19107; Kimi k1.5, arXiv 2501.12599")
def dro_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
             response_mask: ArrayLike, beta: ArrayLike = 1.0) -> TokenLoss:
  """DRO: policy gradient with a quadratic penalty on the log-ratio to the behaviour policy.

  .. math::
    ℓ = −(A·log π − ½β(log π − log π_old)²)

  "DRO" here is Direct Reward Optimization as used for LLM RL losses: P. Richemond et al.,
  "Offline Regularised Reinforcement Learning for Large Language Models Alignment", arXiv
  2405.19107, in the policy-gradient form of Kimi k1.5 (arXiv 2501.12599, the ½τ(log
  π/π_old)² regulariser). The per-token formula is the one of Thinking Machines'
  Tinker `dro` loss (docs: tinker-docs.thinkingmachines.ai/tinker/losses/dro): objective
  log p_θ·A − ½β(log p_θ/q)² with q the sampler. Not "Direct Reasoning Optimization"
  (arXiv 2506.13351) nor distributionally robust optimisation. DRO's "soft" advantage
  (reward minus a learned soft value) is computed outside the loss. β = 1 follows the
  public reimplementation's config default (Tinker's docs example uses 0.05).
  Deviation: the log-ratio in the penalty is clamped to ±20.

  Confidence: paper-equation (Tinker's documented formula and Kimi k1.5's regulariser; no
  loss code was checked).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    beta: β ≥ 0, strength of the quadratic penalty.

  Returns:
    TokenLoss; metrics `penalty_mean` (mean of ½δ²).
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  pen = 0.5 * jnp.square(x.delta)
  return TokenLoss(-(x.adv * x.lp - beta * pen), {"penalty_mean": pen})
