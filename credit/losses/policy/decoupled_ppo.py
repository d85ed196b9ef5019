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

  .. math::
    ρ = exp(clip(ℓ_θ − ℓ_prox, ±20))                       (ℓ_prox = `logprob_old`)
    ℓ_c = max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high));  ℓ_c ← min(ℓ_c, −A·c) if A < 0
    w = exp(ℓ_prox − ℓ_behav)   (stop-gradient; ℓ_behav = `logprob_sampler`)
    L = Σ_t M·1[w ≤ C]·w·ℓ_c / Σ_t M                       (C = `is_threshold` = 5)

  The proximal policy π_prox is the policy the trainer recomputes at train time
  (`logprob_old`); the behaviour policy π_behav is the one that sampled the tokens,
  possibly several versions older (`logprob_sampler`, stamped at sampling time). The trust
  region is centred on π_prox, the off-policy correction is the weight w. Paper: W. Fu et
  al., "AReaL", arXiv 2505.24298 (decoupled PPO objective, after Hilton et al.'s batch-size
  invariant PPO); used by J. Gao et al., "ASearcher", arXiv 2508.07976 (ε = 0.4, C = 5, no
  dual clip, η = 4 versions of staleness). Spec: distill_and_structure.md C1.

  Confidence: code-verified. ASearcher's vendored AReaL,
  `AReaL/areal/utils/functional.py` `ppo_actor_loss_fn` (symmetric `eps_clip`, dual clip
  `c_clip`, `behav_imp_weight_cap`: tokens with w > cap get weight 0, the loss is
  `Σ_M pg_loss·w / loss_mask.count_nonzero()`), called from
  `AReaL/areal/engine/ppo/actor.py` `grpo_loss_fn` with micro-batches weighted by
  `loss_mask.count_nonzero()`; newer AReaL (inclusionAI/AReaL
  `areal/utils/functional/functional.py` `ppo_actor_loss_fn` and `apply_rejection_sampling`,
  `areal/api/cli_args.py` `RejectionSamplingConfig`): `eps_clip_higher`, and rejection
  `action` "mask" (drop) | "clamp" (truncate), `level` "token" | "sequence".

  This per-token term is PPO clip (`ppo_clip_loss`) with ASearcher's defaults; the
  behaviour weight is the shared reduction's sampler correction (`importance_correction`
  on `logprob_old` vs `logprob_sampler`), which the registered loss applies with these
  defaults and mappings:

  * `is_mode="mask"` (default) is AReaL `action="mask"` / the old
    `behav_imp_weight_cap`: w·1[w ≤ C]; `is_mode="truncate"` is `action="clamp"`: min(w, C).
  * `is_threshold` = C = 5.0 (`behav_imp_weight_cap`, `upper`); must be > 1.
  * `is_level="token"` (AReaL `level="token"`); `"geometric"` is `level="sequence"` with
    the ratio metric and `agg="mean"` (weight and test on the geometric mean).
  * `is_threshold_lower`: AReaL `lower` in mask mode.
  * Denominators are those of `response_mask` *before* rejection, as AReaL does
    ("keeps the denominator consistent with loss_weight_fn"; a dropped token is a zero in
    the mean, it does not leave it): unless the caller passes `num_tokens_global` /
    `num_seqs_global`, the registered loss passes Σ M and the number of non-empty rows of
    `response_mask`. (The reduction's own mask mode, used by every other loss, drops
    rejected tokens from the local counts, as verl does.) With "seq-mean-token-mean" the
    per-row lengths are the reduction's (kept tokens); AReaL has no such mode.

  Without `logprob_sampler` the loss is PPO clip with these ε (AReaL with the decoupled
  loss off: π_behav = π_prox, w = 1). Not carried over: AReaL's KL-estimator rejection
  metrics (`metric="kl_k*"`), `agg="sum"`/`"max"` at sequence level, the lower bound in
  clamp mode, and the GSPO `importance_sampling_level` of the PPO ratio.

  Args:
    logprob: [B,T] float32 current-policy log-probs ℓ_θ (differentiated).
    logprob_old: [B,T] float32 proximal-policy log-probs ℓ_prox (stop-gradient).
    advantages: [B,T] float32 (stop-gradient); response_mask: [B,T] bool.
    clip_low, clip_high: ε_low ∈ [0, 1), ε_high ≥ 0 (ASearcher `eps_clip` 0.4 both;
      AReaL `eps_clip`, `eps_clip_higher`).
    clip_ratio_c: dual-clip constant c > 1 for A < 0 (AReaL `c_clip`); None (default,
      as ASearcher) disables it.

  Returns:
    TokenLoss; metrics `clipfrac` (clipped branch active) and `clipfrac_lower` (dual clip
    active). The registered loss adds the reduction's `is_*` metrics: `is_frac_high`
    (fraction of valid tokens with w > C, the capped fraction), `is_frac_rejected` (mask
    mode), `is_weight_mean` (mean w after the cap), `is_ratio_max/min`, `is_mismatch_kl`.

  Example (distill_and_structure.md C1): ℓ_θ = ℓ_prox = −1, ℓ_behav = −1.2, A = 1 →
  w = e^{0.2} = 1.221403, L = −1.221403.
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
                     static_argnames=STATIC_ARGNAMES,
                     token_fn=decoupled_ppo_loss)(_decoupled_ppo)
