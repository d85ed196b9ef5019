"""M2PO: a PPO ratio bound chosen each (micro-)batch so the second moment of the log ratio of
the harmful tokens stays within a budget (off-policy RL on stale data). Registers `m2po`."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32
from credit.losses.policy._common import policy_inputs
from credit.losses.policy.ppo_clip import clipped_surrogate_loss
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["m2po_loss", "m2_trust_bound"]

Array = jax.Array

# The code's "no constraint" bound on the ratio (its `return 0.0, 100000`).
_NO_BOUND = 1e5


def m2_trust_bound(delta_sq: ArrayLike, harmful: ArrayLike, budget: ArrayLike
                   ) -> tuple[Array, Array, Array]:
  """(τ, M2 before, M2 after) with τ the largest cap of abs(Δ) on the harmful tokens such that
  their mean of min(Δ², τ²) fits the budget — the code's breakpoint search, vectorised.

  .. math::
    n = Σ h,   M2 = Σ h·Δ² / n
    M2 ≤ budget (or n = 0)  →  τ = ∞ (no bound)
    else, with v = Δ² of the harmful tokens sorted ascending and c its prefix sums:
      k = min{i : v_i·(n − i − 1) + c_i ≥ budget·n},   τ² = v_{k−1} (0 when k = 0)

  Static shapes: the non-harmful entries sort to the end as +∞ and never count. `τ` is
  returned as `_NO_BOUND` when no bound is needed.
  """
  d2 = jnp.asarray(delta_sq, F32).reshape(-1)
  h = jnp.asarray(harmful, bool).reshape(-1)
  n = jnp.sum(h, dtype=F32)
  m2 = jnp.sum(jnp.where(h, d2, 0.0)) / jnp.maximum(n, 1.0)
  if d2.shape[0] == 0:
    return jnp.asarray(_NO_BOUND, F32), m2, m2
  v = jnp.sort(jnp.where(h, d2, jnp.inf))
  idx = jnp.arange(v.shape[0], dtype=F32)
  finite = idx < n
  csum = jnp.cumsum(jnp.where(finite, v, 0.0))
  target = jnp.asarray(budget, F32) * n
  reach = finite & (jnp.where(finite, v, 0.0) * (n - idx - 1.0) + csum >= target - 1e-12)
  k = jnp.argmax(reach)  # a breakpoint exists whenever M2 > budget (c_{n−1} = n·M2)
  prev = v[jnp.maximum(k - 1, 0)]
  tau_sq = jnp.where(k > 0, jnp.maximum(prev - 1e-12, 0.0), 0.0)
  # M2 after the cap (0 when τ = 0; the code reports the uncapped M2 there).
  after = jnp.where(k > 0, (prev * (n - k) + csum[jnp.maximum(k - 1, 0)]) / jnp.maximum(n, 1.0),
                    0.0)
  constrained = (n > 0) & (m2 > jnp.asarray(budget, F32) + 1e-12)
  tau = jnp.where(constrained, jnp.sqrt(tau_sq), _NO_BOUND)
  return tau, m2, jnp.where(constrained, after, m2)


@policy_loss("m2po", "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale "
             "Data on LLMs? (M2PO, Zheng, Zhao, Chen), arXiv 2510.01161; code "
             "github.com/Infini-AI-Lab/M2PO", batch_coupled=True,
             confidence="code-verified",
             source=("M2PO, arXiv 2510.01161; code: Infini-AI-Lab/M2PO "
                     "verl/trainer/ppo/core_algos.py (compute_m2po_policy_loss, "
                     "kpo_clip_harmful_tokens, _solve_tau_from_sorted_delta2), "
                     "train-scripts/m2po-*.sh"))
def m2po_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
              response_mask: ArrayLike, m2_budget: ArrayLike = 0.04,
              min_clip_low: ArrayLike = 0.0, min_clip_high: ArrayLike = 0.0) -> TokenLoss:
  """M2PO: the clipped surrogate with a ratio bound chosen per batch from a second-moment budget.

  With data stale by many updates, a trust region on the second moment of the log ratios
  keeps training stable where PPO's fixed ε does not. Only the harmful tokens, those whose
  ratio has moved outward, are bounded::

    r = e^{ℓ_θ − ℓ_old},   Δ = ℓ_old − ℓ_θ
    harmful h: (A > 0 and r > 1) or (A < 0 and r < 1)
    τ = m2_trust_bound(Δ², h, budget)                         (stop-gradient)
    ε_low = max(1 − e^{−τ}, min_clip_low),   ε_high = max(e^{τ} − 1, min_clip_high)
    ℓ = max(−A r, −A clip(r, 1 − ε_low, 1 + ε_high))

  When the harmful tokens' mean Δ² is within the budget the bound is off (the plain
  importance-weighted gradient). π_old is the policy the data came from: in the runner,
  `logprob_old_source="sampler"` makes it the (possibly stale) behaviour policy.

  Paper: "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on
  LLMs?" (M2PO), arXiv 2510.01161. Differences from the authors' code: each token's own
  advantage sign (the code reads the row's first token); budget 0 gives τ = 0 (the code's
  solver fails there). The bound uses the rows the loss receives, so the loss is
  batch-coupled.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 log-probs of the policy the data came from.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    m2_budget: the bound on the harmful tokens' mean Δ² (0.04, the code's).
    min_clip_low: lower limit of ε_low (0: none).
    min_clip_high: lower limit of ε_high (0: none).

  Returns:
    TokenLoss; metrics `clipfrac`, `m2` (harmful tokens' M2 before), `m2_after`, `m2_tau`
    (τ; 1e5 when unbounded) and `m2_bounded`.

  Example:
    >>> import numpy as np
    >>> out = m2po_loss(logprob=np.array([[0.5, 0.1, -0.3]]), logprob_old=np.zeros((1, 3)),
    ...                 advantages=np.array([[1., 1., -1.]]), response_mask=np.ones((1, 3), bool))
    >>> np.round(np.asarray(out.loss, np.float64), 6).tolist()   # M2 = 0.117 > 0.04: τ = 0.1
    [[-1.105171, -1.105171, 0.904837]]
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  ratio = jnp.exp(x.delta)
  harmful = x.mask & (((x.adv > 0) & (ratio > 1.0 + 1e-12)) | ((x.adv < 0) & (ratio < 1.0 - 1e-12)))
  d2 = jax.lax.stop_gradient(jnp.square(x.delta))
  tau, m2, after = m2_trust_bound(d2, harmful, m2_budget)
  bounded = tau < _NO_BOUND
  eps_low = jnp.where(bounded, jnp.maximum(1.0 - jnp.exp(-tau), min_clip_low), 1.0)
  eps_high = jnp.where(bounded, jnp.maximum(jnp.exp(tau) - 1.0, min_clip_high), _NO_BOUND - 1)
  loss_BT, clipped, _ = clipped_surrogate_loss(x.adv, ratio, 1.0 - eps_low, 1.0 + eps_high, None)
  ones = jnp.ones_like(x.adv)
  return TokenLoss(loss_BT, {"clipfrac": clipped, "m2": m2 * ones, "m2_after": after * ones,
                             "m2_tau": tau * ones, "m2_bounded": bounded.astype(F32) * ones})
