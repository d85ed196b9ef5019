"""GPG: plain policy gradient, no ratio, no clip."""
from __future__ import annotations

from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["gpg_loss"]


@policy_loss("gpg", "GPG: A Simple and Strong Reinforcement Learning Baseline for Model "
             "Reasoning, arXiv 2504.02546")
def gpg_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
             response_mask: ArrayLike) -> TokenLoss:
  """GPG: plain policy gradient, no ratio, no clip, no KL.

  .. math::
    ℓ = −A·log π

  X. Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
  Reasoning", arXiv 2504.02546. GPG's batch rescaling α = B/#(nonzero rewards) belongs to
  its advantage estimator (`gpg_advantages`). `logprob_old` only feeds the common metrics.

  Confidence: code-verified (verl `core_algos.py` `compute_policy_loss_gpg`).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.

  Returns:
    TokenLoss with no metrics of its own.
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  return TokenLoss(-x.adv * x.lp, {})
