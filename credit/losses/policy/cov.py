"""Covariance-based token selection (Cui et al.): Clip-Cov and KL-Cov.

Both select tokens by the centred covariance of advantage and log-prob over the whole
(micro-)batch, so they are registered as batch-coupled: a sum over micro-batches differs
from the full-batch loss (each micro-batch selects its own tokens, as in verl).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32, token_means
from credit.losses.policy._common import PolicyInputs, policy_inputs
from credit.losses.policy.ppo_clip import clipped_surrogate_loss
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["clip_cov_loss", "kl_cov_loss"]

Array = jax.Array
_PAPER = ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models, "
          "arXiv 2505.22617")


def select_top(priority_BT: Array, ratio: float, count: Array) -> Array:
  """Bool [B,T]: the k highest finite priorities, k = max(⌊ratio·count⌋, 1) (dynamic).

  `lax.top_k` runs with the static bound k_max = max(⌊ratio·B·T⌋, 1) + 1 ≥ k; entries
  beyond the dynamic k or with priority −inf are dropped. `ratio` must be a Python number
  (it fixes k_max).
  """
  B, T = priority_BT.shape
  k_max = int(max(int(float(ratio) * B * T), 1)) + 1
  k_max = min(k_max, B * T)
  k = jnp.maximum(jnp.floor(ratio * count), 1.0)
  vals, idx = jax.lax.top_k(priority_BT.reshape(-1), k_max)
  take = (jnp.arange(k_max) < k) & (vals > -jnp.inf)
  flat = jnp.zeros((B * T,), bool).at[idx].set(take)
  return flat.reshape(B, T)


def centred_cov(x: PolicyInputs) -> Array:
  """(A − mean_M A)·(log π − mean_M log π), stop-gradient, per token (Cui et al. eq. 10)."""
  lp = jax.lax.stop_gradient(x.lp)
  means = token_means(x.mask, x.n, {"adv": x.adv, "lp": lp})
  return (x.adv - means["adv"]) * (lp - means["lp"])


@policy_loss("clip_cov", "Clip-Cov: " + _PAPER, static_argnames=("clip_cov_ratio",),
             batch_coupled=True,
             confidence="code-verified",
             source=("Clip-Cov: " + _PAPER + "; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_clip_cov"))
def clip_cov_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                  response_mask: ArrayLike, clip_low: ArrayLike = 0.2,
                  clip_high: ArrayLike = 0.2, clip_cov_ratio: float = 2e-4,
                  clip_cov_lb: ArrayLike = 1.0, clip_cov_ub: ArrayLike = 5.0,
                  key: jax.Array | None = None) -> TokenLoss:
  """Clip-Cov: PPO clip, plus zeroing a few high-covariance tokens to keep entropy up.

  ::

    c_t = (A_t − mean A)(log π_t − mean log π)          (over valid tokens, stop-gradient)
    candidates: valid, not clipped by PPO, lb < c_t < ub
    pick k = max(⌊r N⌋, 1) candidates;   ℓ_t = max(−A ρ, −A clip(ρ, 1 − ε_l, 1 + ε_h)) (1 − 1[picked])

  Tokens where advantage and log-prob covary most drive the entropy down; detaching a few
  of them keeps it up.

  Paper: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
  arXiv 2505.22617 (§4, Clip-Cov; r = 2e-4, bounds (1, 5)). Differences from verl: with
  `key=None` the k candidates of largest covariance are picked deterministically (with
  `key`, a uniformly random k-subset, as the paper and verl), so the loss is a pure
  function of its arrays; δ is clamped to ±20. The selection couples the whole
  (micro-)batch, as in verl.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    clip_low: PPO ε_low.
    clip_high: PPO ε_high.
    clip_cov_ratio: r, the share of valid tokens to detach (a Python float: it bounds the
      static top-k size).
    clip_cov_lb: lower covariance bound of the candidates.
    clip_cov_ub: upper covariance bound of the candidates.
    key: optional PRNG key for the random selection.

  Returns:
    TokenLoss; metrics `clipfrac` (PPO clip) and `cov_selected_frac`.
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  loss_BT, clipped, _ = clipped_surrogate_loss(x.adv, jnp.exp(x.delta), 1.0 - clip_low,
                                               1.0 + clip_high, None)
  cov = centred_cov(x)
  cand = x.mask & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
  score = cov if key is None else jax.random.uniform(key, cov.shape)
  picked = select_top(jnp.where(cand, score, -jnp.inf), clip_cov_ratio,
                      jnp.sum(x.mask, dtype=F32))
  return TokenLoss(jnp.where(picked, 0.0, loss_BT),
                   {"clipfrac": clipped, "cov_selected_frac": picked})


@policy_loss("kl_cov", "KL-Cov: " + _PAPER, static_argnames=("kl_cov_ratio",),
             batch_coupled=True,
             confidence="code-verified",
             source=("KL-Cov: " + _PAPER + "; code: volcengine/verl@b178a3c "
                     "verl/trainer/ppo/core_algos.py compute_policy_loss_kl_cov"))
def kl_cov_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                response_mask: ArrayLike, kl_cov_ratio: float = 2e-4,
                ppo_kl_coef: ArrayLike = 1.0) -> TokenLoss:
  """KL-Cov: unclipped ratio loss with an abs(log-ratio) penalty on the top-covariance tokens.

  ::

    c_t = (A_t − mean A)(log π_t − mean log π)       (valid tokens, stop-gradient)
    S = the k = max(⌊r N⌋, 1) valid tokens of largest c_t
    ℓ_t = −A ρ + β abs(δ_t) 1[t ∈ S]

  Paper: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
  arXiv 2505.22617 (§4, KL-Cov; r = 2e-4, β = 1). No PPO clip; δ is clamped to ±20 (verl
  does not); abs uses the subgradient 0 at δ = 0, so on-policy the gradient is exactly
  −A ∇log π. Batch-coupled selection, as `clip_cov_loss`.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    kl_cov_ratio: r (a Python float: it bounds the static top-k size).
    ppo_kl_coef: β, weight of abs(δ) on the selected tokens.

  Returns:
    TokenLoss; metrics `kl_selected_frac` and `approx_kl_abs` (mean abs(δ)).
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  cov = centred_cov(x)
  picked = select_top(jnp.where(x.mask, cov, -jnp.inf), kl_cov_ratio,
                      jnp.sum(x.mask, dtype=F32))
  abs_kl = x.delta * jnp.sign(jax.lax.stop_gradient(x.delta))  # |δ|, subgradient 0 at 0
  loss_BT = -x.adv * jnp.exp(x.delta) + jnp.where(picked, ppo_kl_coef * abs_kl, 0.0)
  return TokenLoss(loss_BT, {"kl_selected_frac": picked, "approx_kl_abs": abs_kl})
