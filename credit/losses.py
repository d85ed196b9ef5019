"""Policy losses, loss aggregation, sampler/trainer importance correction, entropy and value losses.

Every policy loss is a pure function

    fn(*, logprob, logprob_old, advantages, response_mask, <hyperparameters>,
       logprob_sampler=None, is_level="token", is_mode="truncate", is_threshold=2.0,
       is_threshold_lower=None, loss_agg_mode=..., num_tokens_global=None,
       num_seqs_global=None, norm_constant=None) -> LossOutput

registered with `credit.registry.register_policy_loss`. Conventions shared by all of them:

* Gradients flow only through `logprob` (the current policy). `logprob_old`, `advantages`
  and `logprob_sampler` are wrapped in `stop_gradient` inside the function.
* Entries outside `response_mask` are replaced by zeros *before* any arithmetic, so NaN or
  inf padding can neither reach the loss nor poison a gradient; they contribute exact zeros.
* Token log-ratios δ = logprob − logprob_old are clamped to [−20, 20] before `exp`
  (verl `compute_policy_loss_vanilla`), unless the docstring says otherwise.
* The per-token loss ℓ[B,T] is reduced by `aggregate_loss(ℓ, M, loss_agg_mode, ...)`
  (outcome_and_clipping.md P3). Global counts make a sum over micro-batches equal the
  full-batch loss (see `aggregate_loss`).
* Sampler/trainer mismatch (the rollout engine's log-probs differ from the trainer's
  `logprob_old`): pass `logprob_sampler`. The loss then calls `importance_correction` with
  `is_level`/`is_mode`/`is_threshold`/`is_threshold_lower`, multiplies ℓ by the
  (stop-gradient) weights and aggregates over the corrected mask (rejected tokens leave
  the denominators, as in verl's rollout rejection sampling). With global counts, the
  caller's counts are used as given.
* `loss_agg_mode`, `is_level` and `is_mode` are static (they pick code paths); every
  numeric hyperparameter may be a traced array.

Metrics are float32 scalars computed on stop-gradient values over the *local* batch:
`approx_kl` (mean of logprob_old − logprob, verl's `ppo_kl`), `ratio_mean/max/min` of
the token ratio exp(δ), plus loss-specific entries (clip fractions etc.).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.registry import register_policy_loss

Array = jax.Array
_F32 = jnp.float32
_LOG_CLAMP = 20.0
_POLICY_NEEDS = ("logprob", "logprob_old", "advantages", "response_mask")
_STATIC = ("loss_agg_mode", "is_level", "is_mode")


class LossOutput(NamedTuple):
  """A scalar loss and its diagnostics (float32 scalars)."""
  loss: Array
  metrics: dict[str, Array]


# --------------------------------------------------------------------------
# Aggregation (outcome_and_clipping.md P3).
# --------------------------------------------------------------------------


def _count(global_value: ArrayLike | None, local: Array) -> Array:
  n = local if global_value is None else jnp.asarray(global_value, _F32)
  return jnp.maximum(n, 1.0)


def _need_norm(norm_constant, mode):
  if norm_constant is None:
    raise ValueError(f"loss_agg_mode={mode!r} needs `norm_constant` (a constant C such as the "
                     "maximum generation length L_max; it must not follow the padded T)")
  return jnp.asarray(norm_constant, _F32)


def _agg_token_mean(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT) / _count(nt, jnp.sum(m_BT, dtype=_F32))


def _nonempty_rows(m_BT):
  return jnp.sum(jnp.any(m_BT, axis=-1), dtype=_F32)


def _agg_seq_mean_token_mean(l_BT, m_BT, nt, ns, c):
  len_B = jnp.sum(m_BT, axis=-1, dtype=_F32)
  seq_B = jnp.sum(l_BT, axis=-1) / jnp.maximum(len_B, 1.0)
  return jnp.sum(seq_B) / _count(ns, _nonempty_rows(m_BT))


def _agg_seq_mean_token_sum(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT) / _count(ns, _nonempty_rows(m_BT))


def _agg_seq_mean_token_sum_norm(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT) / _need_norm(c, "seq-mean-token-sum-norm")


def _agg_seq_mean_token_sum_norm_batch(l_BT, m_BT, nt, ns, c):
  c = _need_norm(c, "seq-mean-token-sum-norm-batch")
  return jnp.sum(l_BT) / (_count(ns, _nonempty_rows(m_BT)) * c)


def _agg_token_sum(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT)


_AGGREGATORS: dict[str, Callable[..., Array]] = {
    "token-mean": _agg_token_mean,
    "seq-mean-token-mean": _agg_seq_mean_token_mean,
    "seq-mean-token-sum": _agg_seq_mean_token_sum,
    "seq-mean-token-sum-norm": _agg_seq_mean_token_sum_norm,
    "seq-mean-token-sum-norm-batch": _agg_seq_mean_token_sum_norm_batch,
    "token-sum": _agg_token_sum,
}
AGG_MODES = tuple(_AGGREGATORS)


def _resolve(table: dict, name: str, what: str):
  try:
    return table[name]
  except (KeyError, TypeError):
    raise ValueError(f"Unknown {what} {name!r}; known: {sorted(table)}") from None


def aggregate_loss(loss_BT: ArrayLike, mask_BT: ArrayLike, mode: str = "token-mean", *,
                   num_tokens_global: ArrayLike | None = None,
                   num_seqs_global: ArrayLike | None = None,
                   norm_constant: ArrayLike | None = None) -> Array:
  """Reduces a per-token loss ℓ[B,T] to a scalar (outcome_and_clipping.md P3).

  With M the mask, |o_i| = Σ_t M[i,t], B' the number of rows with |o_i| > 0, N = ΣM:

  * ``token-mean``: Σ ℓM / N (DAPO token-level; verl default).
  * ``seq-mean-token-mean``: (1/B') Σ_i Σ_t ℓM / max(|o_i|, 1) (GRPO paper, GSPO).
  * ``seq-mean-token-sum``: (1/B') Σ ℓM.
  * ``seq-mean-token-sum-norm``: Σ ℓM / C with C a constant (Dr.GRPO as in verl before
    its global-batch rewrite; spec §2 "verl variant"). C never depends on B or T.
  * ``seq-mean-token-sum-norm-batch``: Σ ℓM / (B'·C), the Dr.GRPO paper's form
    (arXiv 2503.20783; spec §2 `divide_by_batch`), also current verl's behaviour for
    ``seq-mean-token-sum-norm`` with `loss_scale_factor` = C.
  * ``token-sum``: Σ ℓM (DCPO's "only token mean" before its external scaling).

  Fully masked rows contribute 0 and are not counted in B'. Global counts: when a
  minibatch is split into micro-batches by rows, pass the minibatch's `num_tokens_global`
  (N) and `num_seqs_global` (B'); then Σ_micro aggregate_loss(micro) equals the
  minibatch loss, values and gradients (the per-row terms do not couple rows). Under a
  sharded `jit` over the whole batch nothing needs to be passed: sums are global.

  Args:
    loss_BT: [B,T] per-token loss; entries outside the mask are ignored (even NaN).
    mask_BT: [B,T] bool (or 0/1) mask of the tokens that count.
    mode: one of `AGG_MODES`; resolved by dict lookup before tracing.
    num_tokens_global: optional scalar N of the whole minibatch (token-mean).
    num_seqs_global: optional scalar B' of the whole minibatch (seq-mean-*).
    norm_constant: C for the ``-norm`` modes (required there), e.g. the maximum
      generation length L_max; keep it fixed through training.

  Returns:
    float32 scalar.

  Raises:
    ValueError: unknown mode (the message lists the modes) or missing `norm_constant`.

  >>> float(aggregate_loss(jnp.ones((2, 4)), jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool),
  ...                      "seq-mean-token-sum-norm", norm_constant=8.0))
  0.75
  """
  fn = _resolve(_AGGREGATORS, mode, "loss_agg_mode")
  loss_BT = jnp.asarray(loss_BT, _F32)
  mask_BT = jnp.asarray(mask_BT).astype(bool)
  chex.assert_rank([loss_BT, mask_BT], 2)
  chex.assert_equal_shape([loss_BT, mask_BT])
  return fn(jnp.where(mask_BT, loss_BT, 0.0), mask_BT, num_tokens_global, num_seqs_global,
            norm_constant)


# --------------------------------------------------------------------------
# Masked statistics used by metrics.
# --------------------------------------------------------------------------


def _max(x: Array, m: Array) -> Array:
  return jnp.where(jnp.any(m), jnp.max(jnp.where(m, x, -jnp.inf)), 0.0)


def _min(x: Array, m: Array) -> Array:
  return jnp.where(jnp.any(m), jnp.min(jnp.where(m, x, jnp.inf)), 0.0)


def _token_means(m_BT: Array, n: Array, named: dict[str, Array]) -> dict[str, Array]:
  """Masked means Σ M·x / n of several [B,T] arrays (bools count as 0/1), stop-gradient.

  One reduction per array: XLA:CPU materialises every reduction input anyway, and
  stacking the arrays first adds a copy of all of them (measured: 3x the traffic).
  """
  return {k: jnp.sum(jnp.where(m_BT, jax.lax.stop_gradient(v).astype(_F32), 0.0)) / n
          for k, v in named.items()}


def _exp_extrema(m_BT: Array, named: dict[str, Array]) -> dict[str, Array]:
  """{name_max: exp(max x), name_min: exp(min x)} over the mask for finite log-space [B,T]
  arrays; 0 when the mask is empty. Stop-gradient."""
  some = jnp.any(m_BT)
  out = {}
  for k, x in named.items():
    x = jax.lax.stop_gradient(x)
    out[k + "_max"] = jnp.where(some, jnp.exp(jnp.max(jnp.where(m_BT, x, -jnp.inf))), 0.0)
    out[k + "_min"] = jnp.where(some, jnp.exp(jnp.min(jnp.where(m_BT, x, jnp.inf))), 0.0)
  return out


# --------------------------------------------------------------------------
# Sampler/trainer importance correction (TIS / MIS).
# --------------------------------------------------------------------------


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


def _is_log_token(log_r_BT, m_BT):
  return log_r_BT


def _is_log_sequence(log_r_BT, m_BT):
  return jnp.broadcast_to(jnp.sum(log_r_BT, axis=-1, keepdims=True), log_r_BT.shape)


def _is_log_geometric(log_r_BT, m_BT):
  len_B1 = jnp.maximum(jnp.sum(m_BT, axis=-1, keepdims=True, dtype=_F32), 1.0)
  return jnp.broadcast_to(jnp.sum(log_r_BT, axis=-1, keepdims=True) / len_B1, log_r_BT.shape)


_IS_LEVELS = {"token": _is_log_token, "sequence": _is_log_sequence,
              "geometric": _is_log_geometric}
_IS_MODES = ("truncate", "mask")


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
    ``geometric``: log w_i = Σ_t M log r_{i,t} / max(|o_i|, 1).
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
  (Ling team, Ring-1T report: two-sided token masking, [0.5, 2]). Formulas checked against verl `verl/trainer/ppo/rollout_corr_helper.py`
  (`compute_rollout_correction_weights`, `compute_rollout_rejection_mask`). Deviation:
  verl keeps IS weights and rejection separate; here ``mask`` also keeps the ratio as the
  weight (the MIS estimator ρ·1[ρ ≤ C]).

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
  m_BT = jnp.asarray(response_mask).astype(bool)
  weights_BT, keep_BT, token, log_w_BT = _importance_parts(
      logprob_old, logprob_sampler, m_BT, level, mode, threshold, threshold_lower)
  n = jnp.maximum(jnp.sum(m_BT, dtype=_F32), 1.0)
  metrics = {**_token_means(m_BT, n, token), **_exp_extrema(m_BT, {"is_ratio": log_w_BT})}
  return ImportanceCorrection(weights_BT, keep_BT, metrics)


def _importance_parts(logprob_old, logprob_sampler, m_BT, level, mode, threshold,
                      threshold_lower):
  """(weights, kept mask, [B,T] metric arrays, clamped log w) of `importance_correction`."""
  level_fn = _resolve(_IS_LEVELS, level, "importance level")
  if mode not in _IS_MODES:
    raise ValueError(f"Unknown importance mode {mode!r}; known: {sorted(_IS_MODES)}")
  lp_old = jax.lax.stop_gradient(jnp.asarray(logprob_old, _F32))
  lp_smp = jax.lax.stop_gradient(jnp.asarray(logprob_sampler, _F32))
  chex.assert_rank([lp_old, lp_smp, m_BT], 2)
  chex.assert_equal_shape([lp_old, lp_smp, m_BT])
  log_r_BT = jnp.where(m_BT, lp_old - lp_smp, 0.0)
  raw_BT = level_fn(log_r_BT, m_BT)
  log_w_BT = jnp.clip(raw_BT, -_LOG_CLAMP, _LOG_CLAMP)
  w_BT = jnp.exp(log_w_BT)
  high_BT = raw_BT > jnp.log(jnp.asarray(threshold, _F32))
  if threshold_lower is None:
    low_BT = jnp.zeros_like(m_BT)
  else:
    low_BT = raw_BT < jnp.log(jnp.asarray(threshold_lower, _F32))
  if mode == "truncate":
    keep_BT = m_BT
    weights_BT = jnp.where(m_BT, jnp.minimum(w_BT, threshold), 0.0)
  else:
    keep_BT = m_BT & ~high_BT & ~low_BT
    weights_BT = jnp.where(keep_BT, w_BT, 0.0)
  # Metrics cost one [B,T] pass each on CPU: only those that can be non-zero are built.
  log_r_tok = jnp.clip(log_r_BT, -_LOG_CLAMP, _LOG_CLAMP)
  token = {"is_weight_mean": weights_BT, "is_frac_high": high_BT,
           "is_mismatch_kl": jnp.exp(log_r_tok) - log_r_tok - 1.0}
  if threshold_lower is not None:
    token["is_frac_low"] = low_BT
  if mode == "mask":
    token["is_frac_rejected"] = ~keep_BT
  return jax.lax.stop_gradient(weights_BT), keep_BT, token, log_w_BT


# --------------------------------------------------------------------------
# Shared prelude / epilogue of the policy losses.
# --------------------------------------------------------------------------


class _Inputs(NamedTuple):
  lp: Array       # current log-probs (differentiable), 0 outside the mask
  lp_old: Array   # stop-gradient, 0 outside the mask
  adv: Array      # stop-gradient, 0 outside the mask
  mask: Array     # bool
  n: Array        # max(Σ mask, 1) over the local batch
  delta: Array    # clamp(lp − lp_old, ±20), 0 outside the mask


def _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
             is_mode) -> _Inputs:
  _resolve(_AGGREGATORS, loss_agg_mode, "loss_agg_mode")  # fail before any work
  _resolve(_IS_LEVELS, is_level, "importance level")
  if is_mode not in _IS_MODES:
    raise ValueError(f"Unknown importance mode {is_mode!r}; known: {sorted(_IS_MODES)}")
  chex.assert_rank([logprob, logprob_old, advantages, response_mask], 2)
  chex.assert_equal_shape([logprob, logprob_old, advantages, response_mask])
  m_BT = jnp.asarray(response_mask).astype(bool)
  lp = jnp.where(m_BT, jnp.asarray(logprob, _F32), 0.0)
  lp_old = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(logprob_old, _F32)), 0.0)
  adv = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(advantages, _F32)), 0.0)
  delta = jnp.clip(lp - lp_old, -_LOG_CLAMP, _LOG_CLAMP)
  n = jnp.maximum(jnp.sum(m_BT, dtype=_F32), 1.0)
  return _Inputs(lp, lp_old, adv, m_BT, n, delta)


def _finish(loss_BT: Array, x: _Inputs, metrics: dict, *, logprob_sampler, is_level, is_mode,
            is_threshold, is_threshold_lower, loss_agg_mode, num_tokens_global,
            num_seqs_global, norm_constant) -> LossOutput:
  """Importance correction, aggregation and metrics shared by every policy loss.

  `metrics` maps names to [B,T] arrays (reported as masked token means; bools give
  fractions) or to scalars (reported as they are).
  """
  agg = _resolve(_AGGREGATORS, loss_agg_mode, "loss_agg_mode")
  d = jax.lax.stop_gradient(x.delta)
  token = {"approx_kl": -d, "ratio_mean": jnp.exp(d)}
  token.update({k: v for k, v in metrics.items() if jnp.ndim(v) == 2})
  scalars = {k: jax.lax.stop_gradient(v) for k, v in metrics.items() if jnp.ndim(v) != 2}
  logs = {"ratio": d}
  mask = x.mask
  if logprob_sampler is not None:
    chex.assert_equal_shape([logprob_sampler, x.lp])
    weights, mask, is_token, logs["is_ratio"] = _importance_parts(
        x.lp_old, logprob_sampler, x.mask, is_level, is_mode, is_threshold,
        is_threshold_lower)
    loss_BT = loss_BT * weights
    token.update(is_token)
  # Metrics are over the valid tokens of `response_mask` (before any rejection).
  metrics = {**_token_means(x.mask, x.n, token), **scalars, **_exp_extrema(x.mask, logs)}
  loss = agg(jnp.where(mask, loss_BT, 0.0), mask, num_tokens_global, num_seqs_global,
             norm_constant)
  return LossOutput(loss, metrics)


def _policy_loss(name: str, paper: str, static_argnames=()):
  """Registers a policy loss and completes its docstring with the shared arguments."""
  register = register_policy_loss(name, needs=_POLICY_NEEDS, paper=paper,
                                  static_argnames=_STATIC + tuple(static_argnames))

  def deco(fn):
    fn.__doc__ = fn.__doc__.replace("@common_args@", _COMMON_ARGS_DOC)
    return register(fn)

  return deco


def _seq_len(m_BT: Array) -> Array:
  return jnp.sum(m_BT, axis=-1, dtype=_F32)


def _seq_mean(x_BT: Array, m_BT: Array) -> Array:
  """Σ_t M x / max(|o|,1) per row, [B]."""
  return jnp.sum(jnp.where(m_BT, x_BT, 0.0), axis=-1) / jnp.maximum(_seq_len(m_BT), 1.0)


_COMMON_ARGS_DOC = """    logprob_sampler: optional [B,T] sampler log-probs; enables
      `importance_correction` with `is_level`, `is_mode`, `is_threshold`,
      `is_threshold_lower`.
    loss_agg_mode: aggregation mode (see `aggregate_loss`), static.
    num_tokens_global, num_seqs_global, norm_constant: see `aggregate_loss`."""


# --------------------------------------------------------------------------
# PPO clip family.
# --------------------------------------------------------------------------


def _clipped_surrogate(adv, ratio, low, high, clip_ratio_c):
  """(ℓ, clipped, dual_active) for ℓ = max(−Aρ, −A·clip(ρ, low, high)) with dual clip."""
  l1 = -adv * ratio
  l2 = -adv * jnp.clip(ratio, low, high)
  lc = jnp.maximum(l1, l2)
  clipped = l2 > l1
  if clip_ratio_c is None:
    return lc, clipped, jnp.zeros_like(clipped)
  l3 = -adv * clip_ratio_c
  neg = adv < 0
  return jnp.where(neg, jnp.minimum(lc, l3), lc), clipped, neg & (lc > l3)


def _check_dual(clip_ratio_c):
  if isinstance(clip_ratio_c, (int, float)) and clip_ratio_c <= 1.0:
    raise ValueError(f"clip_ratio_c must be > 1 (dual-clip PPO), got {clip_ratio_c}")


@_policy_loss("ppo_clip", "PPO: Proximal Policy Optimization Algorithms, arXiv 1707.06347; "
              "dual clip: arXiv 1912.09729; clip-higher: DAPO, arXiv 2503.14476")
def ppo_clip(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
             response_mask: ArrayLike, clip_low: ArrayLike = 0.2, clip_high: ArrayLike = 0.2,
             clip_ratio_c: ArrayLike | None = 3.0, logprob_sampler: ArrayLike | None = None,
             is_level: str = "token", is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
             is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
             num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
  """PPO clipped surrogate with decoupled (clip-higher) bounds and dual clip (spec P4).

  .. math::
    δ = clip(log π − log π_old, −20, 20),  ρ = e^δ
    ℓ_c = max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high))
    ℓ = ℓ_c if A ≥ 0 else min(ℓ_c, −A·c)

  PPO: J. Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347
  (eq. 7). Dual clip: D. Ye et al., "Mastering Complex Control in MOBA Games with Deep RL",
  arXiv 1912.09729 (c = 3). Clip-higher ε_high = 0.28: Q. Yu et al., "DAPO", arXiv
  2503.14476. Verified against verl `core_algos.py` `compute_policy_loss_vanilla`.
  With ε = 0.2 and token-mean this is GRPO's loss (DeepSeekMath, arXiv 2402.03300).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: ε_low, ε_high (DAPO: 0.2, 0.28).
    clip_ratio_c: dual-clip constant c > 1 for A < 0; None disables the dual clip.
@common_args@

  Returns:
    LossOutput; metrics add `clipfrac` (fraction where the clipped branch is active) and
    `clipfrac_lower` (dual clip active).

  Example (spec §1): A=0.866024, log π_old=−1, log π=−0.7 → ρ=1.349859, ℓ=−1.039229.
  """
  _check_dual(clip_ratio_c)
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  ratio = jnp.exp(x.delta)
  loss_BT, clipped, dual = _clipped_surrogate(x.adv, ratio, 1.0 - clip_low, 1.0 + clip_high,
                                              clip_ratio_c)
  metrics = {"clipfrac": clipped, "clipfrac_lower": dual}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


def dcpo_clip_bounds(logprob_old: ArrayLike, eps_low: ArrayLike = 0.16,
                     eps_high: ArrayLike = 0.2, cap: ArrayLike = 10.0) -> tuple[Array, Array]:
  """DCPO's per-token ratio bounds from the old token probability q = exp(logprob_old).

  .. math::
    r_low = ½ + ½·sqrt(max(1 − 4ε_low/q, 0)),   r_high = min(½ + ½·sqrt(1 + 4ε_high/q), cap)

  (the solution of |(p/q − 1)·p| ≤ ε for the ratio p/q). Rare tokens get wide bounds:
  q=0.9 → [0.768742, 1.187184], q=0.5 → [0.5, 1.306226], q=0.01 → [0.5, 5.0] with the
  defaults. Source: DCPO, "Dynamic Clipping Policy Optimization", arXiv 2509.02333;
  verified against elysiameik-afk/dcpomol `core_algos.py` `get_clip_low_high`.
  Deviation: at q = 0 exactly (log q < −103 in float32) the code returns r_low = 1; here
  the continuous limit r_low = ½ is used (the spec's r_low = 0 matches neither).

  Args:
    logprob_old: [..] log q (stop-gradient).
    eps_low, eps_high: ε_low, ε_high (README: 0.16, 0.2; run script: 0.2, 0.28).
    cap: upper cap on r_high (the code uses max(clip_ratio_c, 10)).

  Returns:
    (r_low, r_high), float32 arrays shaped like `logprob_old`.
  """
  q = jnp.exp(jax.lax.stop_gradient(jnp.asarray(logprob_old, _F32)))
  q = jnp.maximum(q, 1e-30)
  low = 0.5 + 0.5 * jnp.sqrt(jnp.maximum(1.0 - 4.0 * eps_low / q, 0.0))
  high = jnp.minimum(0.5 + 0.5 * jnp.sqrt(1.0 + 4.0 * eps_high / q), cap)
  return low, high


@_policy_loss("dcpo", "DCPO: Dynamic Clipping Policy Optimization, arXiv 2509.02333")
def dcpo(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
         response_mask: ArrayLike, clip_low: ArrayLike = 0.16, clip_high: ArrayLike = 0.2,
         clip_ratio_c: ArrayLike = 10.0, logprob_sampler: ArrayLike | None = None,
         is_level: str = "token", is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
         is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
         num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
  """DCPO dynamic-clip surrogate: PPO clip with per-token bounds from q (spec §8).

  .. math::
    [r_low, r_high] = dcpo_clip_bounds(log π_old, ε_low, ε_high, max(c, 10))
    ℓ_c = max(−Aρ, −A·clip(ρ, r_low, r_high));   ℓ = min(ℓ_c, −A·c) where A < 0

  DCPO, "Dynamic Clipping Policy Optimization", arXiv 2509.02333. Verified against
  elysiameik-afk/dcpomol `core_algos.py` `compute_policy_loss_dcpo` (clip_type
  "dynamic": dual clip kept with c = `clip_ratio_c`). Deviation: δ is clamped to ±20
  (the code does not clamp). The SAS advantage and the OTM scaling are not part of the
  loss (advantage estimator; `loss_agg_mode="token-sum"` plus an external scale).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: ε_low, ε_high of the bound formula (not ratio offsets).
    clip_ratio_c: dual-clip constant; the r_high cap is max(c, 10).
@common_args@

  Returns:
    LossOutput; metrics add `clipfrac`, `clipfrac_lower`, `clip_low_mean`, `clip_high_mean`.
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  low, high = dcpo_clip_bounds(x.lp_old, clip_low, clip_high, jnp.maximum(clip_ratio_c, 10.0))
  loss_BT, clipped, dual = _clipped_surrogate(x.adv, jnp.exp(x.delta), low, high, clip_ratio_c)
  metrics = {"clipfrac": clipped, "clipfrac_lower": dual, "clip_low_mean": low,
             "clip_high_mean": high}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


# --------------------------------------------------------------------------
# Sequence-level ratios: GSPO, LUSPO, GMPO, VESPO.
# --------------------------------------------------------------------------


def _gspo_token_losses(x: _Inputs, clip_low, clip_high):
  """GSPO-token per-token losses, clip indicator and the per-row log s_i."""
  log_s_B = _seq_mean(x.delta, x.mask)
  sg_lp = jax.lax.stop_gradient(x.lp)
  log_s_BT = jax.lax.stop_gradient(log_s_B)[:, None] + (x.lp - sg_lp)
  s_BT = jnp.exp(jnp.minimum(log_s_BT, 10.0))
  l1 = -x.adv * s_BT
  l2 = -x.adv * jnp.clip(s_BT, 1.0 - clip_low, 1.0 + clip_high)
  return jnp.maximum(l1, l2), l2 > l1, log_s_B


def _seq_metrics(log_s_B: Array, m_BT: Array) -> dict[str, Array]:
  rows = jnp.any(m_BT, axis=-1)
  nr = jnp.maximum(jnp.sum(rows, dtype=_F32), 1.0)
  s = jnp.exp(jnp.clip(log_s_B, -_LOG_CLAMP, _LOG_CLAMP))
  return {"seq_ratio_mean": jnp.sum(jnp.where(rows, s, 0.0)) / nr,
          "seq_ratio_max": _max(s, rows), "seq_ratio_min": _min(s, rows)}


@_policy_loss("gspo", "GSPO: Group Sequence Policy Optimization, arXiv 2507.18071")
def gspo(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
         response_mask: ArrayLike, clip_low: ArrayLike = 3e-4, clip_high: ArrayLike = 4e-4,
         logprob_sampler: ArrayLike | None = None, is_level: str = "token",
         is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
         is_threshold_lower: ArrayLike | None = None,
         loss_agg_mode: str = "seq-mean-token-mean", num_tokens_global=None,
         num_seqs_global=None, norm_constant=None) -> LossOutput:
  """GSPO with the length-normalised sequence ratio, in the GSPO-token form (spec §6).

  .. math::
    log s_i = Σ_t M δ_{i,t} / max(|o_i|, 1)
    log s_{i,t} = sg[log s_i] + log π_{i,t} − sg[log π_{i,t}],  clamped ≤ 10
    ℓ_{i,t} = max(−A s_{i,t}, −A·clip(s_{i,t}, 1−ε_low, 1+ε_high))

  The value of s_{i,t} is s_i (a whole sequence is clipped or not), the gradient is per
  token: ∇ℓ = −A s_i ∇log π_{i,t} when unclipped. With sequence-constant advantages and
  ``seq-mean-token-mean`` (the paper's and verl's forced mode, the default here) this is
  GSPO's sequence objective. No dual clip. C. Zheng et al., "Group Sequence Policy
  Optimization", arXiv 2507.18071 (eqs. 5-7, 10-11; ε = 3e-4 / 4e-4, §5.1). Verified
  against verl `core_algos.py` `compute_policy_loss_gspo`. Deviations: token δ is
  clamped to ±20 before averaging (verl does not clamp token δ); other aggregation
  modes are allowed (verl forces seq-mean-token-mean).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: ε_low, ε_high on the sequence ratio.
@common_args@

  Returns:
    LossOutput; metrics add `clipfrac` (token share in clipped sequences) and
    `seq_ratio_mean/max/min` over non-empty rows.

  Example (spec §6): token log-ratios [0.02, 0.04], A=1 → s=1.030455, ℓ=−1.0004 and a zero
  gradient; log-ratios [0.1, −0.3, 0.2] → s=1 (unclipped).
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  loss_BT, clipped, log_s_B = _gspo_token_losses(x, clip_low, clip_high)
  metrics = {"clipfrac": clipped, **_seq_metrics(log_s_B, x.mask)}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


@_policy_loss("luspo", "LUSPO: Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261")
def luspo(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
          response_mask: ArrayLike, clip_low: ArrayLike = 3e-4, clip_high: ArrayLike = 4e-4,
          logprob_sampler: ArrayLike | None = None, is_level: str = "token",
          is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
          is_threshold_lower: ArrayLike | None = None,
          loss_agg_mode: str = "seq-mean-token-mean", num_tokens_global=None,
          num_seqs_global=None, norm_constant=None) -> LossOutput:
  """LUSPO: GSPO with each sequence's loss scaled by its length |o_i|.

  .. math::
    ℓ_{i,t} = |o_i| · ℓ^{GSPO}_{i,t}

  so that under ``seq-mean-token-mean`` the objective is (1/B') Σ_i |o_i|·min(s_i A_i,
  clip(s_i) A_i) and every token's gradient carries weight s_i A_i instead of s_i A_i/|o_i|
  (GSPO's per-token average under-weights long answers, which the paper links to
  response-length collapse). F. Liu et al., "Length-Unbiased Sequence Policy
  Optimization: Revealing and Controlling Response Length Variation in RLVR", arXiv
  2602.05261. Provenance: the paper's description ("scale each sequence's loss by its
  length"); the authors' code (murphy4122/luspo) was not in the searchable index, so this
  is the best-documented reading, not code-verified. With ``seq-mean-token-mean`` it
  equals `gspo` with ``seq-mean-token-sum``.

  Args: as `gspo`, plus:
@common_args@

  Returns:
    LossOutput with the metrics of `gspo`.
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  loss_BT, clipped, log_s_B = _gspo_token_losses(x, clip_low, clip_high)
  loss_BT = loss_BT * _seq_len(x.mask)[:, None]
  metrics = {"clipfrac": clipped, **_seq_metrics(log_s_B, x.mask)}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


@_policy_loss("gmpo", "GMPO: Geometric-Mean Policy Optimization, arXiv 2507.20673")
def gmpo(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
         response_mask: ArrayLike, clip_low: ArrayLike = 0.4, clip_high: ArrayLike = 0.4,
         logprob_sampler: ArrayLike | None = None, is_level: str = "token",
         is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
         is_threshold_lower: ArrayLike | None = None,
         loss_agg_mode: str = "seq-mean-token-mean", num_tokens_global=None,
         num_seqs_global=None, norm_constant=None) -> LossOutput:
  """GMPO: geometric mean of token ratios, clipped per token in log space.

  .. math::
    δ^c_{i,t} = sgn(A)·min(sgn(A)·δ, sgn(A)·clip(δ, −ε_low, ε_high))
    r_i = exp(Σ_t M δ^c_{i,t} / |o_i|),   Ā_i = Σ_t M A_{i,t} / |o_i|
    ℓ_{i,t} = −Ā_i r_i   (the same value on every token of row i)

  Under ``seq-mean-token-mean`` (default) the loss is (1/B') Σ_i −Ā_i r_i. Y. Zhao et al.,
  "Geometric-Mean Policy Optimization", arXiv 2507.20673 (ε = 0.4 in log space, i.e.
  ratio range (e^{−0.4}, e^{0.4})). Verified against verl `core_algos.py`
  `compute_policy_loss_geo_mean`. Deviations: δ is clamped to ±20 first; |o_i| uses
  max(|o_i|, 1) instead of +1e-8; empty rows are excluded from the mean (verl averages
  over all rows); with `logprob_sampler` the token weights are averaged arithmetically
  by the aggregation (verl takes their geometric mean per sequence).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: log-space clip ε_low, ε_high.
@common_args@

  Returns:
    LossOutput; metrics add `clipfrac` (clipped tokens with A>0), `clipfrac_lower`
    (A<0) and `seq_ratio_mean/max/min` of r_i.
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  sgn = jnp.sign(x.adv)
  d_clip = jnp.clip(x.delta, -clip_low, clip_high)
  d_min = sgn * jnp.minimum(sgn * x.delta, sgn * d_clip)
  log_r_B = _seq_mean(d_min, x.mask)
  adv_B = _seq_mean(x.adv, x.mask)
  loss_B = -adv_B * jnp.exp(log_r_B)
  loss_BT = jnp.broadcast_to(loss_B[:, None], x.mask.shape)
  clipped = x.delta != d_clip
  metrics = {"clipfrac": clipped & (x.adv > 0), "clipfrac_lower": clipped & (x.adv < 0),
             **_seq_metrics(log_r_B, x.mask)}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


@_policy_loss("vespo", "VESPO: Variational Sequence-Level Soft Policy Optimization, "
              "arXiv 2602.10693")
def vespo(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
          response_mask: ArrayLike, k_pos: ArrayLike = 2.0, lambda_pos: ArrayLike = 3.0,
          k_neg: ArrayLike = 3.0, lambda_neg: ArrayLike = 2.0,
          logprob_sampler: ArrayLike | None = None, is_level: str = "token",
          is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
          is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
          num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
  """VESPO: REINFORCE with a gamma-shaped kernel of the *unnormalised* sequence ratio.

  .. math::
    log w_i = clip(Σ_t M δ_{i,t}, −20, 20)          (product of token ratios, no 1/|o|)
    φ(w) = w^k e^{λ(1−w)} = exp(λ + k log w − λ w),  φ(1) = 1
    (k, λ) = (k_pos, λ_pos) if Ā_i ≥ 0 else (k_neg, λ_neg)
    ℓ_{i,t} = −sg[φ(w_i)]·A_{i,t}·log π_{i,t}

  so ∇ℓ = −φ(w_i) A ∇log π. G. Shen et al., "VESPO: Variational Sequence-Level Soft Policy
  Optimization for Stable Off-Policy LLM Training", arXiv 2602.10693. Verified against
  FloyedShen/VESPO `recipe/vespo/code/core_algos.py` `compute_policy_loss_vespo`; the
  defaults are that code's (k+=2, λ+=3, k−=3, λ−=2; its docstring lists other values).
  Deviations: the advantage sign is taken from the row's mean advantage Ā_i (the code
  reads the first token); with `logprob_sampler` the sampler correction multiplies ℓ
  through the generic `importance_correction` instead of being folded into w.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    k_pos, lambda_pos, k_neg, lambda_neg: kernel shape for A ≥ 0 / A < 0.
@common_args@

  Returns:
    LossOutput; metrics add `phi_mean/max/min` over non-empty rows and
    `seq_log_ratio_mean`.
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  log_w_B = jnp.clip(jnp.sum(x.delta, axis=-1), -_LOG_CLAMP, _LOG_CLAMP)
  pos_B = _seq_mean(x.adv, x.mask) >= 0
  k_B = jnp.where(pos_B, k_pos, k_neg)
  lam_B = jnp.maximum(jnp.where(pos_B, lambda_pos, lambda_neg), 1e-4)
  phi_B = jax.lax.stop_gradient(jnp.exp(lam_B + k_B * log_w_B - lam_B * jnp.exp(log_w_B)))
  loss_BT = -phi_B[:, None] * x.adv * x.lp
  rows = jnp.any(x.mask, axis=-1)
  nr = jnp.maximum(jnp.sum(rows, dtype=_F32), 1.0)
  metrics = {"phi_mean": jnp.sum(jnp.where(rows, phi_B, 0.0)) / nr,
             "phi_max": _max(phi_B, rows), "phi_min": _min(phi_B, rows),
             "seq_log_ratio_mean": jnp.sum(jnp.where(rows, log_w_B, 0.0)) / nr}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


# --------------------------------------------------------------------------
# Gradient-coefficient losses: CISPO, GPG, DRO.
# --------------------------------------------------------------------------


@_policy_loss("cispo", "CISPO (MiniMax-M1: Scaling Test-Time Compute Efficiently with "
              "Lightning Attention), arXiv 2506.13585")
def cispo(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
          response_mask: ArrayLike, clip_low: ArrayLike = 1.0, clip_high: ArrayLike = 0.28,
          logprob_sampler: ArrayLike | None = None, is_level: str = "token",
          is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
          is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
          num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
  """CISPO: clip the (stop-gradient) IS weight, never the token's gradient.

  .. math::
    r̂ = clip(e^δ, 1−ε_low, 1+ε_high),   ℓ = −sg[r̂]·A·log π

  Every token keeps a gradient (PPO drops those outside the band). MiniMax, "MiniMax-M1:
  Scaling Test-Time Compute Efficiently with Lightning Attention", arXiv 2506.13585 (eq.
  4; token-mean over the group, no lower bound: "we set ε_low to a large value"); verified
  against verl `core_algos.py` `compute_policy_loss_cispo`. Defaults ε_low = 1 (lower
  bound 0), ε_high = 0.28 follow Trinity-RFT's CISPO defaults; tune ε_high.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: IS-weight clip ε_low, ε_high.
@common_args@

  Returns:
    LossOutput; metrics add `clipfrac` (tokens whose weight was clipped).
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  ratio = jnp.exp(x.delta)
  w = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
  loss_BT = -w * x.adv * x.lp
  metrics = {"clipfrac": w != ratio}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


@_policy_loss("gpg", "GPG: A Simple and Strong Reinforcement Learning Baseline for Model "
              "Reasoning, arXiv 2504.02546")
def gpg(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
        response_mask: ArrayLike, logprob_sampler: ArrayLike | None = None,
        is_level: str = "token", is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
        is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
        num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
  """GPG: plain policy gradient, no ratio, no clip, no KL.

  .. math::
    ℓ = −A·log π

  X. Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
  Reasoning", arXiv 2504.02546. Verified against verl `core_algos.py`
  `compute_policy_loss_gpg`. GPG's batch rescaling α = B/#(nonzero rewards) belongs to its
  advantage estimator. `logprob_old` only feeds the metrics.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
@common_args@

  Returns:
    LossOutput with the common metrics.
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  loss_BT = -x.adv * x.lp
  return _finish(loss_BT, x, {}, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


@_policy_loss("dro", "DRO: Offline Regularised RL for LLM Alignment (Direct Reward "
              "Optimization), arXiv 2405.19107; Kimi k1.5, arXiv 2501.12599")
def dro(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
        response_mask: ArrayLike, beta: ArrayLike = 1.0,
        logprob_sampler: ArrayLike | None = None, is_level: str = "token",
        is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
        is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
        num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
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

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    beta: β ≥ 0, strength of the quadratic penalty.
@common_args@

  Returns:
    LossOutput; metrics add `penalty_mean` (mean of ½δ²).
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  pen = 0.5 * jnp.square(x.delta)
  loss_BT = -(x.adv * x.lp - beta * pen)
  metrics = {"penalty_mean": pen}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


@_policy_loss("sapo", "SAPO: Soft Adaptive Policy Optimization, arXiv 2511.20347")
def sapo(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
         response_mask: ArrayLike, tau_pos: ArrayLike = 1.0, tau_neg: ArrayLike = 1.05,
         logprob_sampler: ArrayLike | None = None, is_level: str = "token",
         is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
         is_threshold_lower: ArrayLike | None = None,
         loss_agg_mode: str = "seq-mean-token-mean", num_tokens_global=None,
         num_seqs_global=None, norm_constant=None) -> LossOutput:
  """SAPO: a smooth sigmoid gate of the token ratio instead of a hard clip.

  .. math::
    f_τ(ρ) = σ(τ(ρ − 1))·4/τ,   τ = τ_pos if A > 0 else τ_neg
    ℓ = −f_τ(ρ)·A

  ∇ℓ = −4σ(1−σ)·ρ·A·∇log π: weight 1 on-policy (ρ = 1), decaying smoothly off-policy;
  τ_neg > τ_pos damps negative-advantage tokens faster. C. Gao et al. (Qwen), "Soft
  Adaptive Policy Optimization", arXiv 2511.20347. Verified against verl `core_algos.py`
  `compute_policy_loss_sapo` (which forces ``seq-mean-token-mean``, the default here).

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    tau_pos, tau_neg: gate temperatures (> 0).
@common_args@

  Returns:
    LossOutput; metrics add `gate_weight_mean`, the mean gradient weight 4σ(1−σ)ρ.
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  ratio = jnp.exp(x.delta)
  tau = jnp.where(x.adv > 0, tau_pos, tau_neg)
  sig = jax.nn.sigmoid(tau * (ratio - 1.0))
  loss_BT = -sig * (4.0 / tau) * x.adv
  sig_sg = jax.lax.stop_gradient(sig)
  metrics = {"gate_weight_mean": 4.0 * sig_sg * (1.0 - sig_sg) * ratio}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


# --------------------------------------------------------------------------
# Covariance-based token selection: Clip-Cov, KL-Cov.
# --------------------------------------------------------------------------


def _select_top(priority_BT: Array, ratio: ArrayLike, count: Array) -> Array:
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


def _centred_cov(x: _Inputs) -> Array:
  """(A − mean_M A)·(log π − mean_M log π), stop-gradient, per token (Cui et al. eq. 10)."""
  lp = jax.lax.stop_gradient(x.lp)
  means = _token_means(x.mask, x.n, {"adv": x.adv, "lp": lp})
  return (x.adv - means["adv"]) * (lp - means["lp"])


@_policy_loss("clip_cov", "Clip-Cov: The Entropy Mechanism of Reinforcement Learning for "
              "Reasoning Language Models, arXiv 2505.22617", static_argnames=("clip_cov_ratio",))
def clip_cov(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
             response_mask: ArrayLike, clip_low: ArrayLike = 0.2, clip_high: ArrayLike = 0.2,
             clip_cov_ratio: float = 2e-4, clip_cov_lb: ArrayLike = 1.0,
             clip_cov_ub: ArrayLike = 5.0, key: jax.Array | None = None,
             logprob_sampler: ArrayLike | None = None, is_level: str = "token",
             is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
             is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
             num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
  """Clip-Cov: PPO clip, plus zeroing a few high-covariance tokens to keep entropy up.

  .. math::
    c_t = (A_t − mean A)(log π_t − mean log π)      (over valid tokens, stop-gradient)
    candidates: valid, not clipped by PPO, lb < c_t < ub
    pick k = max(⌊r·N⌋, 1) candidates;  ℓ_t = max(−Aρ, −A clip(ρ, 1−ε_l, 1+ε_h))·(1 − 1[picked])

  G. Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models", arXiv 2505.22617 (§4, Clip-Cov; r = 2e-4, bounds (1, 5)). Verified against verl
  `core_algos.py` `compute_policy_loss_clip_cov`. Selection: with `key`, a uniformly
  random k-subset of the candidates (the paper and verl's `randperm`); with `key=None`,
  deterministically the k candidates of largest covariance (a documented deviation so
  the loss is a pure function of its arrays). δ is clamped to ±20 (verl does not). The
  selection couples the whole (micro-)batch: micro-batches select per micro-batch, as
  verl does, so micro-batch sums differ from the full batch.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    clip_low, clip_high: PPO ε_low, ε_high.
    clip_cov_ratio: r, share of valid tokens to detach (a Python float: it bounds the
      static top-k size).
    clip_cov_lb, clip_cov_ub: covariance band of the candidates.
    key: optional PRNG key for the random selection.
@common_args@

  Returns:
    LossOutput; metrics add `clipfrac` (PPO clip) and `cov_selected_frac`.
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  ratio = jnp.exp(x.delta)
  loss_BT, clipped, _ = _clipped_surrogate(x.adv, ratio, 1.0 - clip_low, 1.0 + clip_high, None)
  cov = _centred_cov(x)
  cand = x.mask & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
  score = cov if key is None else jax.random.uniform(key, cov.shape)
  picked = _select_top(jnp.where(cand, score, -jnp.inf), clip_cov_ratio,
                       jnp.sum(x.mask, dtype=_F32))
  loss_BT = jnp.where(picked, 0.0, loss_BT)
  metrics = {"clipfrac": clipped, "cov_selected_frac": picked}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


@_policy_loss("kl_cov", "KL-Cov: The Entropy Mechanism of Reinforcement Learning for "
              "Reasoning Language Models, arXiv 2505.22617", static_argnames=("kl_cov_ratio",))
def kl_cov(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
           response_mask: ArrayLike, kl_cov_ratio: float = 2e-4, ppo_kl_coef: ArrayLike = 1.0,
           logprob_sampler: ArrayLike | None = None, is_level: str = "token",
           is_mode: str = "truncate", is_threshold: ArrayLike = 2.0,
           is_threshold_lower: ArrayLike | None = None, loss_agg_mode: str = "token-mean",
           num_tokens_global=None, num_seqs_global=None, norm_constant=None) -> LossOutput:
  """KL-Cov: unclipped ratio loss with a |log-ratio| penalty on the top-covariance tokens.

  .. math::
    c_t = (A_t − mean A)(log π_t − mean log π)     (valid tokens, stop-gradient)
    S = the k = max(⌊r·N⌋, 1) valid tokens of largest c_t
    ℓ_t = −A ρ + β·|δ_t|·1[t ∈ S]

  G. Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models", arXiv 2505.22617 (§4, KL-Cov; r = 2e-4, β = 1). Verified against verl
  `core_algos.py` `compute_policy_loss_kl_cov` (no PPO clip; top-k selection). δ is
  clamped to ±20 (verl does not). |δ| uses the subgradient 0 at δ = 0 (as torch's
  `abs`), so on-policy the gradient is exactly −A∇log π. Batch-coupled selection, as for
  `clip_cov`.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool.
    kl_cov_ratio: r (a Python float: it bounds the static top-k size).
    ppo_kl_coef: β, weight of |δ| on the selected tokens.
@common_args@

  Returns:
    LossOutput; metrics add `kl_selected_frac` and `approx_kl_abs` (mean |δ|).
  """
  x = _prepare(logprob, logprob_old, advantages, response_mask, loss_agg_mode, is_level,
               is_mode)
  ratio = jnp.exp(x.delta)
  cov = _centred_cov(x)
  picked = _select_top(jnp.where(x.mask, cov, -jnp.inf), kl_cov_ratio,
                       jnp.sum(x.mask, dtype=_F32))
  abs_kl = x.delta * jnp.sign(jax.lax.stop_gradient(x.delta))  # |δ|, subgradient 0 at 0
  loss_BT = -x.adv * ratio + jnp.where(picked, ppo_kl_coef * abs_kl, 0.0)
  metrics = {"kl_selected_frac": picked, "approx_kl_abs": abs_kl}
  return _finish(loss_BT, x, metrics, logprob_sampler=logprob_sampler, is_level=is_level,
                 is_mode=is_mode, is_threshold=is_threshold,
                 is_threshold_lower=is_threshold_lower, loss_agg_mode=loss_agg_mode,
                 num_tokens_global=num_tokens_global, num_seqs_global=num_seqs_global,
                 norm_constant=norm_constant)


# Losses whose per-token value depends on statistics of the whole (micro-)batch.
BATCH_COUPLED_LOSSES = frozenset({"clip_cov", "kl_cov"})


# --------------------------------------------------------------------------
# Entropy bonus and value loss.
# --------------------------------------------------------------------------


def entropy_bonus(*, entropy: ArrayLike, response_mask: ArrayLike, coef: ArrayLike = 0.0,
                  loss_agg_mode: str = "token-mean", num_tokens_global=None,
                  num_seqs_global=None, norm_constant=None) -> LossOutput:
  """Entropy regulariser: loss = −coef·agg(H), so minimising it raises the entropy.

  verl `compute_entropy_loss` + `entropy_coeff` (default 0 in current verl; 0.001 in
  older configs). The gradient flows through `entropy`.

  Args:
    entropy: [B,T] per-token policy entropy (differentiable).
    response_mask: [B,T] bool.
    coef: bonus coefficient (≥ 0 rewards entropy).
    loss_agg_mode, num_tokens_global, num_seqs_global, norm_constant: `aggregate_loss`.

  Returns:
    LossOutput with metrics `entropy` (token mean of H) and `entropy_agg` (agg(H)).
  """
  agg = _resolve(_AGGREGATORS, loss_agg_mode, "loss_agg_mode")
  chex.assert_rank([entropy, response_mask], 2)
  chex.assert_equal_shape([entropy, response_mask])
  m_BT = jnp.asarray(response_mask).astype(bool)
  h_BT = jnp.where(m_BT, jnp.asarray(entropy, _F32), 0.0)
  h_agg = agg(h_BT, m_BT, num_tokens_global, num_seqs_global, norm_constant)
  n = jnp.maximum(jnp.sum(m_BT, dtype=_F32), 1.0)
  metrics = {"entropy": jax.lax.stop_gradient(jnp.sum(h_BT) / n),
             "entropy_agg": jax.lax.stop_gradient(h_agg)}
  return LossOutput(-coef * h_agg, metrics)


def value_loss(*, values: ArrayLike, values_old: ArrayLike, returns: ArrayLike,
               response_mask: ArrayLike, clip_range_value: ArrayLike | None = 0.5,
               loss_agg_mode: str = "token-mean", num_tokens_global=None,
               num_seqs_global=None, norm_constant=None) -> LossOutput:
  """PPO clipped value loss (spec §5).

  .. math::
    V^c = clip(V, V_old − c_v, V_old + c_v)
    loss = ½·agg(max((V − R)², (V^c − R)²))

  J. Schulman et al., arXiv 1707.06347 (value clipping as in OpenAI baselines); verified
  against verl `core_algos.py` `compute_value_loss`. Gradients flow only through `values`;
  `values_old` and `returns` are stop-gradient.

  Args:
    values: [B,T] current critic predictions V.
    values_old: [B,T] critic values at rollout time.
    returns: [B,T] targets R (e.g. GAE returns).
    response_mask: [B,T] bool.
    clip_range_value: c_v (verl `cliprange_value` 0.5); None = unclipped ½(V − R)².
    loss_agg_mode, num_tokens_global, num_seqs_global, norm_constant: `aggregate_loss`.

  Returns:
    LossOutput with metrics `vf_clipfrac`, `vf_mse` (token mean of (V−R)²), `vpred_mean`.
  """
  agg = _resolve(_AGGREGATORS, loss_agg_mode, "loss_agg_mode")
  chex.assert_rank([values, values_old, returns, response_mask], 2)
  chex.assert_equal_shape([values, values_old, returns, response_mask])
  m_BT = jnp.asarray(response_mask).astype(bool)
  v = jnp.where(m_BT, jnp.asarray(values, _F32), 0.0)
  v_old = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(values_old, _F32)), 0.0)
  ret = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(returns, _F32)), 0.0)
  l1 = jnp.square(v - ret)
  if clip_range_value is None:
    l_BT, clipped = l1, jnp.zeros_like(m_BT)
  else:
    v_clip = jnp.clip(v, v_old - clip_range_value, v_old + clip_range_value)
    l2 = jnp.square(v_clip - ret)
    l_BT, clipped = jnp.maximum(l1, l2), l2 > l1
  n = jnp.maximum(jnp.sum(m_BT, dtype=_F32), 1.0)
  loss = 0.5 * agg(jnp.where(m_BT, l_BT, 0.0), m_BT, num_tokens_global, num_seqs_global,
                   norm_constant)
  metrics = _token_means(m_BT, n, {"vf_clipfrac": clipped, "vf_mse": l1, "vpred_mean": v})
  return LossOutput(loss, metrics)
