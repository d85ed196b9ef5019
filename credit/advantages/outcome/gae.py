"""PPO's generalised advantage estimate (critic baseline), skipping masked tokens."""
from __future__ import annotations

import jax
from jax.typing import ArrayLike

from credit import ops
from credit.ops.baselines import GAEOutput
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["GAEOutput", "gae_advantages"]

_PAPER = ("High-Dimensional Continuous Control Using Generalized Advantage Estimation, "
          "arXiv 1506.02438")


@register_estimator("gae", needs=("reward", "values", "response_mask"), paper=_PAPER,
                    static_argnames=("whiten",), returns_output=True,
                    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"},
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py compute_gae_advantage_return"))
def gae_advantages(*, reward: ArrayLike, values: ArrayLike, response_mask: ArrayLike,
                   logprob_old: ArrayLike | None = None, logprob_ref: ArrayLike | None = None,
                   token_reward: ArrayLike | None = None, gamma: float = 1.0, lam: float = 1.0,
                   kl_coef: float = 0.0, whiten: bool = True) -> GAEOutput:
  """PPO's generalised advantage estimate with a critic, skipping masked tokens.

  Over the valid positions of each row (M = 1), with the value after the last one 0::

    δ_t = r_t + γ V_{next valid} − V_t,    Â_t = δ_t + γλ Â_{next valid}
    returns_t = Â_t + V_t,                  A = whiten(Â) over all valid tokens

  r_t is the outcome on the last valid token, plus optional dense rewards, minus the k1
  KL-in-reward term β (logprob_old − logprob_ref). Observation tokens (M = 0) pass the
  next value and the running Â through unchanged, as verl's multi-turn GAE does.

  Paper: "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
  arXiv 1506.02438, eq. 16. For Python `gamma == lam == 1` (verl's default) the sum
  telescopes to Â_t = G_t − V_t and is computed without a scan.

  Args:
    reward: [B] outcome rewards.
    values: [B,T] critic values at each position (masked positions ignored).
    response_mask: [B,T] bool.
    logprob_old: optional [B,T] behaviour log-probs (with `logprob_ref`, for `kl_coef`).
    logprob_ref: optional [B,T] reference log-probs.
    token_reward: optional [B,T] dense rewards.
    gamma: discount γ (may be traced).
    lam: GAE λ (may be traced).
    kl_coef: β of the KL-in-reward term.
    whiten: static; whiten the advantages over all valid tokens (verl does).

  Returns:
    GAEOutput(advantages [B,T], returns [B,T]); both zero outside the mask.

  Example:
    >>> import numpy as np
    >>> out = gae_advantages(reward=np.array([1.]), values=np.array([[.5, .6, .8]]),
    ...                      response_mask=np.ones((1, 3), bool), lam=.95, whiten=False)
    >>> [np.round(np.asarray(x, np.float64), 4).tolist() for x in out]
    [[[0.4705, 0.39, 0.2]], [[0.9705, 0.99, 1.0]]]
  """
  return ops.gae("gae_advantages", reward=reward, values=values, response_mask=response_mask,
                 logprob_old=logprob_old, logprob_ref=logprob_ref, token_reward=token_reward,
                 gamma=gamma, lam=lam, kl_coef=kl_coef, whiten=whiten)
