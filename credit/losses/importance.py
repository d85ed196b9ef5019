"""Sampler/trainer importance correction: truncated (TIS) or masked (MIS) weights."""
from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import lookup
from credit.losses.aggregation import F32, LOG_CLAMP, exp_extrema, token_count, token_means

__all__ = ["ImportanceCorrection", "importance_correction"]

Array = jax.Array


class ImportanceCorrection(NamedTuple):
  """Output of `importance_correction`.

  Attributes:
    weights: [B,T] float32 stop-gradient weights, 0 outside the (corrected) mask.
    mask: [B,T] bool, `response_mask` with rejected tokens/sequences removed.
    metrics: dict of float32 scalars (prefix ``is_``).
  """
  weights: Array
  mask: Array
  metrics: dict[str, Array]


# Levels: the unclamped log w [B,T] from the token log-ratios log r (0 outside the mask).


def _level_token(log_r_BT, m_BT):
  return log_r_BT


def _level_sequence(log_r_BT, m_BT):
  return jnp.broadcast_to(jnp.sum(log_r_BT, axis=-1, keepdims=True), log_r_BT.shape)


def _level_geometric(log_r_BT, m_BT):
  len_B1 = jnp.maximum(jnp.sum(m_BT, axis=-1, keepdims=True, dtype=F32), 1.0)
  return jnp.broadcast_to(jnp.sum(log_r_BT, axis=-1, keepdims=True) / len_B1, log_r_BT.shape)


# Modes: (kept mask, weights, mode-specific [B,T] metrics) from the mask, w = exp(clamped
# log w), the out-of-bounds indicators and the threshold.


def _mode_truncate(m_BT, w_BT, high_BT, low_BT, threshold):
  return m_BT, jnp.where(m_BT, jnp.minimum(w_BT, threshold), 0.0), {}


def _mode_mask(m_BT, w_BT, high_BT, low_BT, threshold):
  keep_BT = m_BT & ~high_BT & ~low_BT
  return keep_BT, jnp.where(keep_BT, w_BT, 0.0), {"is_frac_rejected": ~keep_BT}


_LEVELS: dict[str, Callable] = {"token": _level_token, "sequence": _level_sequence,
                                "geometric": _level_geometric}
_MODES: dict[str, Callable] = {"truncate": _mode_truncate, "mask": _mode_mask}
IS_LEVELS = tuple(_LEVELS)
IS_MODES = tuple(_MODES)


def check_importance_args(level: str, mode: str) -> None:
  """Raises `UnknownNameError` for an unknown importance level or mode (before tracing)."""
  lookup(_LEVELS, level, "importance level")
  lookup(_MODES, mode, "importance mode")


def importance_correction(*, logprob_old: ArrayLike, logprob_sampler: ArrayLike,
                          response_mask: ArrayLike, level: str = "token",
                          mode: str = "truncate", threshold: ArrayLike = 2.0,
                          threshold_lower: ArrayLike | None = None) -> ImportanceCorrection:
  """Importance weights for the sampler/trainer mismatch: truncated (TIS) or masked (MIS).

  The rollout engine samples from π_sampler (its log-probs `logprob_sampler`), but the
  trainer's behaviour policy is π_old (`logprob_old`, recomputed by the trainer). With
  log r_t = log π_old − log π_sampler on valid tokens:

  * level ``token``: log w_{i,t} = log r_{i,t};
    ``sequence``: log w_i = Σ_t M log r_{i,t} (the product of token ratios);
    ``geometric``: log w_i = Σ_t M log r_{i,t} / max(L_i, 1), L_i the row's length.
    Sequence-level weights are broadcast to the row's tokens. log w is clamped to
    [−20, 20] before `exp` (verl SAFETY_BOUND).
  * mode ``truncate`` (TIS, Yao et al. 2025): weight = min(w, C) with C = `threshold`;
    nothing is rejected.
  * mode ``mask`` (MIS / IcePop): weight = w·1[lo ≤ w ≤ C] with lo = `threshold_lower`
    (default 0: one-sided as in "When speed kills stability"; IcePop uses [0.5, 2]). The
    test is done on the *unclamped* log w. Rejected tokens (all tokens of a rejected row
    for sequence levels) are removed from the returned mask.

  Weights are stop-gradient: they change the sampling measure, not the objective.

  Sources: F. Yao, L. Liu et al., "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training" (blog, fengyao.notion.site/off-policy-rl, 2025: token TIS,
  C=2); "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
  Mismatch" (blog, richardli.xyz/rl-collapse, 2025: sequence-level TIS/MIS); IcePop
  (Ling team, Ring-1T report: two-sided token masking, [0.5, 2]). Formulas checked against
  verl `verl/trainer/ppo/rollout_corr_helper.py` (`compute_rollout_correction_weights`,
  `compute_rollout_rejection_mask`). Deviation: verl keeps IS weights and rejection
  separate; here ``mask`` also keeps the ratio as the weight (the MIS estimator ρ·1[ρ ≤ C]).

  Args:
    logprob_old: [B,T] trainer-side log-probs of the behaviour policy.
    logprob_sampler: [B,T] log-probs reported by the sampler.
    response_mask: [B,T] bool.
    level: "token" | "sequence" | "geometric" (static).
    mode: "truncate" | "mask" (static).
    threshold: upper bound C > 0.
    threshold_lower: lower bound for ``mask`` (None: no lower bound).

  Returns:
    `ImportanceCorrection(weights, mask, metrics)`; metrics over the valid tokens of
    `response_mask`: is_weight_mean, is_ratio_max/min (w before truncation),
    is_frac_high (w > C), is_mismatch_kl (k3 estimate of KL(π_sampler‖π_old) per token,
    from the token ratios), and is_frac_low (only with `threshold_lower`) and
    is_frac_rejected (only in ``mask`` mode).
  """
  level_fn = lookup(_LEVELS, level, "importance level")
  mode_fn = lookup(_MODES, mode, "importance mode")
  m_BT = jnp.asarray(response_mask).astype(bool)
  lp_old = jax.lax.stop_gradient(jnp.asarray(logprob_old, F32))
  lp_smp = jax.lax.stop_gradient(jnp.asarray(logprob_sampler, F32))
  chex.assert_rank([lp_old, lp_smp, m_BT], 2)
  chex.assert_equal_shape([lp_old, lp_smp, m_BT])
  log_r_BT = jnp.where(m_BT, lp_old - lp_smp, 0.0)
  raw_BT = level_fn(log_r_BT, m_BT)
  log_w_BT = jnp.clip(raw_BT, -LOG_CLAMP, LOG_CLAMP)
  high_BT = raw_BT > jnp.log(jnp.asarray(threshold, F32))
  if threshold_lower is None:
    low_BT = jnp.zeros_like(m_BT)
  else:
    low_BT = raw_BT < jnp.log(jnp.asarray(threshold_lower, F32))
  keep_BT, weights_BT, mode_metrics = mode_fn(m_BT, jnp.exp(log_w_BT), high_BT, low_BT,
                                              threshold)
  # Metrics cost one [B,T] pass each on CPU: only those that can be non-zero are built.
  log_r_tok = jnp.clip(log_r_BT, -LOG_CLAMP, LOG_CLAMP)
  token = {"is_weight_mean": weights_BT, "is_frac_high": high_BT,
           "is_mismatch_kl": jnp.exp(log_r_tok) - log_r_tok - 1.0}
  if threshold_lower is not None:
    token["is_frac_low"] = low_BT
  token.update(mode_metrics)
  metrics = {**token_means(m_BT, token_count(m_BT), token),
             **exp_extrema(m_BT, {"is_ratio": log_w_BT})}
  return ImportanceCorrection(jax.lax.stop_gradient(weights_BT), keep_BT, metrics)
