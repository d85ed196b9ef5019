"""Decoupled PPO (AReaL / ASearcher): PPO clip against the proximal policy, times a capped
behaviour importance weight π_prox/π_behav. Registers `decoupled_ppo`."""
from __future__ import annotations

import inspect

import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32
from credit.losses.policy.ppo_clip import ppo_clip_loss
from credit.losses.reduction import (POLICY_NEEDS, STATIC_ARGNAMES, LossOutput, TokenLoss,
                                     _full_loss)
from credit.registry import register_policy_loss

__all__ = ["decoupled_ppo_loss"]

_NAME = "decoupled_ppo"
_PAPER = ("AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language "
          "Reasoning, arXiv 2505.24298 (decoupled PPO objective); ASearcher: Beyond Ten Turns: "
          "Unlocking Long-Horizon Agentic Search with Large-Scale Asynchronous RL, "
          "arXiv 2508.07976 (settings)")
# The behaviour correction is the shared reduction's importance correction with the
# sampler's log-probs; these are its defaults here (ASearcher: behav_imp_weight_cap 5.0,
# tokens above it dropped).
_REDUCTION_DEFAULTS = {"is_mode": "mask", "is_threshold": 5.0}


def _check_clip(clip_low, clip_high) -> None:
  for arg, v in (("clip_low", clip_low), ("clip_high", clip_high)):
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
      raise ValueError(f"decoupled_ppo: {arg} must be >= 0 (a PPO clip ε), got {v}")
  if isinstance(clip_low, (int, float)) and not isinstance(clip_low, bool) and clip_low >= 1:
    raise ValueError(f"decoupled_ppo: clip_low must be < 1 (lower ratio bound 1 − ε > 0), "
                     f"got {clip_low}")


def _check_cap(cap) -> None:
  if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap <= 1.0:
    raise ValueError(f"decoupled_ppo: is_threshold (the behaviour weight cap, AReaL "
                     f"behav_imp_weight_cap / RejectionSamplingConfig.upper) must be > 1, "
                     f"got {cap}")


def decoupled_ppo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                       response_mask: ArrayLike, clip_low: ArrayLike = 0.4,
                       clip_high: ArrayLike = 0.4,
                       clip_ratio_c: ArrayLike | None = None) -> TokenLoss:
  """Decoupled PPO: PPO clip on π_θ/π_prox, weighted by the capped π_prox/π_behav.

  With asynchronous rollouts the behaviour policy that sampled a token may be several
  versions old. The trust region is centred on the proximal policy (the one the trainer
  recomputes, `logprob_old`), and the off-policy correction is a capped weight::

    ρ = exp(clip(ℓ_θ − ℓ_prox, ±20))
    ℓ_c = max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high));   ℓ_c ← min(ℓ_c, −A c) if A < 0
    w = exp(ℓ_prox − ℓ_behav)                           (stop-gradient; `logprob_sampler`)
    L = Σ_t M 1[w ≤ C] w ℓ_c / Σ_t M                     (C = `is_threshold` = 5)

  This per-token term is PPO clip with ASearcher's defaults; the weight is the shared
  reduction's sampler correction, which the registered loss applies as AReaL does: mask
  mode (`is_mode="mask"`: w 1[w ≤ C]; "truncate" is min(w, C)), token level, and the
  denominators of `response_mask` before rejection (a rejected token is a zero in the
  mean). Without `logprob_sampler` it is PPO clip.

  Papers: AReaL, arXiv 2505.24298 (the decoupled objective); ASearcher, arXiv 2508.07976
  (ε = 0.4, C = 5, no dual clip, staleness 4).

  Args:
    logprob: [B,T] float32 current-policy log-probs ℓ_θ (differentiated).
    logprob_old: [B,T] float32 proximal-policy log-probs ℓ_prox (stop-gradient).
    advantages: [B,T] float32 (stop-gradient).
    response_mask: [B,T] bool.
    clip_low: ε_low ∈ [0, 1).
    clip_high: ε_high ≥ 0.
    clip_ratio_c: dual-clip constant c > 1 for A < 0; None (as ASearcher) disables it.

  Returns:
    TokenLoss; metrics `clipfrac` and `clipfrac_lower`. The registered loss adds the
    reduction's `is_*` metrics (`is_frac_high`, `is_frac_rejected`, `is_weight_mean`, ...).

  Example:
    With ℓ_θ = ℓ_prox = −1, ℓ_behav = −1.2 and A = 1, w = e^0.2 = 1.221403 and
    L = −1.221403 (the registered loss with `logprob_sampler`).
  """
  _check_clip(clip_low, clip_high)
  return ppo_clip_loss(logprob=logprob, logprob_old=logprob_old, advantages=advantages,
                       response_mask=response_mask, clip_low=clip_low, clip_high=clip_high,
                       clip_ratio_c=clip_ratio_c)


_reduced = _full_loss(_NAME, decoupled_ppo_loss, "token-mean")


def _decoupled_ppo(**kwargs) -> LossOutput:
  for k, v in _REDUCTION_DEFAULTS.items():
    kwargs.setdefault(k, v)
  _check_cap(kwargs["is_threshold"])
  m_BT = jnp.asarray(kwargs["response_mask"]).astype(bool)
  if kwargs.get("num_tokens_global") is None:   # AReaL: the count before rejection
    kwargs["num_tokens_global"] = jnp.sum(m_BT, dtype=F32)
  if kwargs.get("num_seqs_global") is None:
    kwargs["num_seqs_global"] = jnp.sum(jnp.any(m_BT, axis=-1), dtype=F32)
  return _reduced(**kwargs)


_sig = inspect.signature(_reduced)
_decoupled_ppo.__signature__ = _sig.replace(parameters=[
    p.replace(default=_REDUCTION_DEFAULTS[p.name]) if p.name in _REDUCTION_DEFAULTS else p
    for p in _sig.parameters.values()])
_decoupled_ppo.__name__ = _decoupled_ppo.__qualname__ = _NAME
_decoupled_ppo.__doc__ = _reduced.__doc__
_decoupled_ppo.__module__ = __name__

# Registered by hand (not with `policy_loss`): the loss needs the sampler's log-probs (so
# the runner always supplies them), and the reduction runs with AReaL's defaults and
# denominators (see the docstring).
register_policy_loss(_NAME, needs=POLICY_NEEDS + ("logprob_sampler",), paper=_PAPER,
                     confidence="code-verified",
                     source=(_PAPER + "; code: inclusionAI/ASearcher "
                             "AReaL/areal/utils/functional.py (ppo_actor_loss_fn), "
                             "AReaL/areal/engine/ppo/actor.py (grpo_loss_fn); code: "
                             "inclusionAI/AReaL areal/utils/functional/functional.py "
                             "(ppo_actor_loss_fn, apply_rejection_sampling)"),
                     static_argnames=STATIC_ARGNAMES,
                     token_fn=decoupled_ppo_loss)(_decoupled_ppo)
