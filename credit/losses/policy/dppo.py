"""DPPO: a trust region on the sampled token's probability divergence (Binary-TV, Binary-KL)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.policy._common import PolicyInputs, policy_inputs
from credit.losses.reduction import TokenLoss, policy_loss

__all__ = ["dppo_tv_loss", "dppo_kl_loss", "binary_kl"]

Array = jax.Array
_EPS = 1e-8  # verl's smoothing constant inside the binary KL's second log


def binary_kl(logprob_old: ArrayLike, logprob: ArrayLike) -> Array:
  """KL(Bern(μ) ‖ Bern(π)) between the old and new probability of the sampled token.

  .. math::
    D = μ(log μ − log π) + (1 − μ)·log((1 − μ + 10⁻⁸) / (1 − π + 10⁻⁸)),
    μ = e^{log π_old},  π = e^{log π}

  as in verl's `compute_policy_loss_dppo_kl`. Where an argument of the second log is not
  positive (a log-prob above 0, which no distribution gives) verl's value is NaN and
  every comparison with it is false; here D = +inf there, which compares the same way
  (outside any threshold) and stays finite under gradients (the caller stops them).

  Args:
    logprob_old, logprob: float32 arrays of one shape (log μ, log π).

  Returns:
    float32 array of that shape.
  """
  lq = jnp.asarray(logprob_old, jnp.float32)
  lp = jnp.asarray(logprob, jnp.float32)
  q, p = jnp.exp(lq), jnp.exp(lp)
  a, b = 1.0 - q + _EPS, 1.0 - p + _EPS
  ok = (a > 0) & (b > 0)
  tail = jnp.log(jnp.where(ok, a, 1.0)) - jnp.log(jnp.where(ok, b, 1.0))
  return jnp.where(ok, q * (lq - lp) + (1.0 - q) * tail, jnp.inf)


def _dppo_token_loss(x: PolicyInputs, valid: Array, clip_ratio_c: ArrayLike) -> TokenLoss:
  """ℓ = −A·sg(min(ρ, c))·log π·valid, with verl's two clip fractions."""
  ratio = jnp.exp(x.delta)
  trunc = jax.lax.stop_gradient(jnp.minimum(ratio, clip_ratio_c))
  loss_BT = -x.adv * trunc * x.lp * valid.astype(jnp.float32)
  return TokenLoss(loss_BT, {"clipfrac": ~valid, "clipfrac_lower": (ratio > clip_ratio_c) & valid})


def _check(clip_low, clip_high, clip_ratio_c):
  for k, v in (("clip_low", clip_low), ("clip_high", clip_high), ("clip_ratio_c", clip_ratio_c)):
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
      raise ValueError(f"{k} must be > 0 (a divergence threshold or a ratio cap), got {v}")


_PAPER = ("DPPO: Rethinking the Trust Region in LLM Reinforcement Learning, arXiv 2602.04879")


@policy_loss("dppo_tv", _PAPER, confidence="code-verified",
             source=_PAPER + "; code: volcengine/verl verl/trainer/ppo/core_algos.py "
             "compute_policy_loss_dppo_tv")
def dppo_tv_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                 response_mask: ArrayLike, clip_low: ArrayLike = 0.15,
                 clip_high: ArrayLike = 0.15, clip_ratio_c: ArrayLike = 20.0) -> TokenLoss:
  """DPPO-Binary-TV: keep a token's gradient while its probability moved less than δ.

  .. math::
    π = e^{log π},  μ = e^{log π_old},  ρ = e^δ (δ clamped to ±20)
    valid = (π − μ ≤ δ_high) if A > 0 else (π − μ ≥ −δ_low)
    ℓ = −A·sg(min(ρ, c))·log π·valid

  PPO's ratio band judges a token by π/μ, which over-constrains rare tokens (a move from
  10⁻⁵ to 10⁻³ is a ratio of 100) and under-constrains frequent ones (0.99 → 0.8 is a
  ratio of 0.81). DPPO masks by the total-variation distance of the sampled token's
  binary distribution, the absolute difference of π and μ, and only on the side the advantage pushes toward.
  Inside the region the gradient is the truncated-IS policy gradient −A·min(ρ, c)·∇log π
  (the gradient of PPO's −Aρ, without its clip); outside it is 0. The cap c replaces
  the dual clip; the paper recommends a large c (§5.4). The loss value is
  −A·min(ρ, c)·log π (not −Aρ), as in the code; only its gradient matters.

  Paper: "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879
  (DPPO, Binary-TV approximation). Defaults: δ = 0.15 (the released DPPO run script);
  c = 20 (the code's default when unset; the script sets 10⁴, i.e. no truncation); the
  script aggregates with ``seq-mean-token-sum-norm`` and Dr.GRPO advantages, here
  ``token-mean`` is the function's default as in the code. The paper's bypass mode
  (trust region against the sampler's log-probs) is `logprob_old` = the sampler's. As
  verl's `compute_policy_loss_dppo_tv`.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: TV thresholds δ_low (A ≤ 0: how far π may fall) and δ_high
      (A > 0: how far π may rise), in probability units.
    clip_ratio_c: cap c on the (stop-gradient) importance ratio.

  Returns:
    TokenLoss; metrics `clipfrac` (tokens outside the trust region) and `clipfrac_lower`
    (tokens inside it whose ratio exceeds c), verl's `pg_clipfrac` and
    `pg_clipfrac_lower`.

  Example: A = 1, μ = 0.5, π = 0.7 (π − μ = 0.2 > 0.15): ℓ = 0, no gradient; with π =
  0.6 the gradient on log π is −1.2 (= −A·π/μ).
  """
  _check(clip_low, clip_high, clip_ratio_c)
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  lp = jax.lax.stop_gradient(x.lp)
  diff = jnp.exp(lp) - jnp.exp(x.lp_old)
  valid = jnp.where(x.adv > 0, diff <= clip_high, diff >= -clip_low)
  return _dppo_token_loss(x, valid, clip_ratio_c)


@policy_loss("dppo_kl", _PAPER, confidence="code-verified",
             source=_PAPER + "; code: volcengine/verl verl/trainer/ppo/core_algos.py "
             "compute_policy_loss_dppo_kl")
def dppo_kl_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                 response_mask: ArrayLike, clip_low: ArrayLike = 0.05,
                 clip_high: ArrayLike = 0.05, clip_ratio_c: ArrayLike = 20.0) -> TokenLoss:
  """DPPO-Binary-KL: keep a token's gradient while the binary KL of its probability is ≤ δ.

  .. math::
    D = KL(Bern(μ) ‖ Bern(π))  (`binary_kl`),  ρ = e^δ (δ clamped to ±20)
    valid = (D ≤ δ_high or π ≤ μ) if A > 0 else (D ≤ δ_low or π ≥ μ)
    ℓ = −A·sg(min(ρ, c))·log π·valid

  The same construction as `dppo_tv_loss` with the KL divergence of the sampled token's
  binary distribution (μ, 1 − μ) → (π, 1 − π) as the trust-region measure; a token is
  only masked when it has moved in the direction its advantage rewards.

  Paper: "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879
  (DPPO, Binary-KL approximation). Defaults: δ = 0.05 (the released DPPO run script),
  c = 20 (the code's default when unset). Deviation: where verl's binary KL is NaN (a
  log-prob above 0) it is +inf here, with the same mask (see `binary_kl`). Otherwise as
  verl's `compute_policy_loss_dppo_kl`.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: binary-KL thresholds δ_low (A ≤ 0) and δ_high (A > 0), nats.
    clip_ratio_c: cap c on the (stop-gradient) importance ratio.

  Returns:
    TokenLoss; metrics `clipfrac` (tokens outside the trust region) and `clipfrac_lower`
    (tokens inside it whose ratio exceeds c).

  Example: A = 1, μ = 0.5, π = 0.7: D = 0.5·log(0.5/0.7) + 0.5·log(0.5/0.3) = 0.087 >
  0.05, so ℓ = 0; with A = −1 the token moved against its advantage's push and keeps
  its gradient.
  """
  _check(clip_low, clip_high, clip_ratio_c)
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  lp = jax.lax.stop_gradient(x.lp)
  d = binary_kl(x.lp_old, lp)
  up = jnp.exp(lp) > jnp.exp(x.lp_old)   # π > μ
  down = jnp.exp(lp) < jnp.exp(x.lp_old)  # π < μ
  valid = jnp.where(x.adv > 0, (d <= clip_high) | ~up, (d <= clip_low) | ~down)
  return _dppo_token_loss(x, valid, clip_ratio_c)
