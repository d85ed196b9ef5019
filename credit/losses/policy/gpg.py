"""GPG: plain policy gradient, no ratio, no clip."""
from __future__ import annotations

from jax.typing import ArrayLike

from credit.losses.policy._common import policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["gpg_loss"]


@policy_loss("gpg", "GPG: A Simple and Strong Reinforcement Learning Baseline for Model "
             "Reasoning, arXiv 2504.02546",
             confidence="code-verified",
             source=("GPG, arXiv 2504.02546; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_gpg"))
def gpg_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
             response_mask: ArrayLike) -> TokenLoss:
  """GPG: plain policy gradient, no ratio, no clip, no KL.

  ::

    ℓ = −A log π

  Paper: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
  arXiv 2504.02546. GPG's batch rescaling α belongs to its advantage estimator
  (`gpg_advantages`). `logprob_old` only feeds the common metrics. As verl's
  `compute_policy_loss_gpg`.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs (metrics only).
    advantages: [B,T] float32.
    response_mask: [B,T] bool.

  Returns:
    TokenLoss with no metrics of its own.

  Example:
    >>> import numpy as np
    >>> out = gpg_loss(logprob=np.log([[0.5, 0.9]]), logprob_old=np.log([[0.25, 0.9]]),
    ...                advantages=np.array([[1., -1.]]), response_mask=np.ones((1, 2), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()
    [[0.693147, -0.105361]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  return TokenLoss(-x.adv * x.lp, {})
