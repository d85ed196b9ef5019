"""Per-token KL estimators between the policy and a reference, as a loss or a reward term.

Estimators (J. Schulman, "Approximating KL Divergence", joschu.net/blog/kl-approx.html,
2020), with d = clip(log π − log π_ref, −20, 20) per token::

  k1  = d                       unbiased for KL(π‖π_ref) on samples of π, high variance
  abs = |d|
  k2  = ½ d²                    ("mse"); its gradient is the gradient of KL(π‖π_ref)
  k3  = e^{−d} + d − 1, clipped to [−10, 10]   ("low_var_kl"), unbiased, ≥ 0

Straight-through variants ``k1+``, ``k3+``, ``abs+`` take the *value* of the named
estimator and the *gradient* of k2 (½(log π − log π_ref)², unclamped):
value + (k2 − sg[k2]) − sg[…]; ``k2+`` is k2. Verified against verl
`verl/trainer/ppo/core_algos.py` (`kl_penalty`, `kl_penalty_forward`). Deviation: verl
clamps the log-difference only inside k3; here every estimator's value uses the clamped d
(the straight-through gradient keeps verl's unclamped k2).

The gradient flows only through `logprob`; `logprob_ref` (and `logprob_old` in
`kl_in_reward`) are stop-gradient.
"""
from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import lookup
from credit.losses.aggregation import F32, LOG_CLAMP, aggregate_loss, token_count
from credit.losses.reduction import LossOutput

__all__ = ["KL_KINDS", "kl_penalty", "kl_loss", "kl_in_reward"]

Array = jax.Array


def _k1(d):
  return d


def _abs(d):
  return jnp.abs(d)


def _k2(d):
  return 0.5 * jnp.square(d)


def _k3(d):
  return jnp.clip(jnp.exp(-d) + d - 1.0, -10.0, 10.0)


_BASE: dict[str, Callable[[Array], Array]] = {"k1": _k1, "abs": _abs, "k2": _k2, "k3": _k3}
_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
# kind -> (estimator, straight-through); "<kind>+" is straight-through except for k2.
_KINDS: dict[str, tuple[Callable[[Array], Array], bool]] = {}
for _name in [*_BASE, *_ALIASES]:
  _base = _ALIASES.get(_name, _name)
  _KINDS[_name] = (_BASE[_base], False)
  _KINDS[_name + "+"] = (_BASE[_base], _base != "k2")
del _name, _base
KL_KINDS = tuple(sorted(_KINDS))


def kl_penalty(logprob: ArrayLike, logprob_ref: ArrayLike, kind: str = "k3") -> Array:
  """Per-token KL estimate [B,T] (or any shape) of KL(π‖π_ref) on tokens sampled from π.

  Args:
    logprob: log π of the sampled tokens (differentiable).
    logprob_ref: log π_ref of the same tokens (stop-gradient).
    kind: "k1" | "k2" | "k3" | "abs", aliases "kl", "mse", "low_var_kl", and the
      straight-through "<kind>+" forms (value of <kind>, gradient of k2). Static.

  Returns:
    float32 array shaped like `logprob`. Not masked: use `kl_loss` to aggregate.

  Example: log π = −0.7, log π_ref = −1.0 → k3 = 0.040818.
  """
  fn, straight = lookup(_KINDS, kind, "KL kind")
  lp = jnp.asarray(logprob, F32)
  ref = jax.lax.stop_gradient(jnp.asarray(logprob_ref, F32))
  chex.assert_equal_shape([lp, ref])
  diff = lp - ref
  value = fn(jnp.clip(diff, -LOG_CLAMP, LOG_CLAMP))
  if not straight:
    return value
  k2 = 0.5 * jnp.square(diff)
  return jax.lax.stop_gradient(value) + (k2 - jax.lax.stop_gradient(k2))


def kl_loss(*, logprob: ArrayLike, logprob_ref: ArrayLike, response_mask: ArrayLike,
            kind: str = "k3", loss_agg_mode: str = "token-mean",
            num_tokens_global: ArrayLike | None = None,
            num_seqs_global: ArrayLike | None = None,
            norm_constant: ArrayLike | None = None) -> LossOutput:
  """GRPO's KL-in-loss term agg(kl_penalty(log π, log π_ref)).

  Add β·loss to the policy loss (verl `kl_loss_coef` 0.001, DeepSeekMath 0.04, k3).
  Entries outside the mask contribute exact zeros, even when NaN.

  Args:
    logprob, logprob_ref: [B,T] float32; response_mask: [B,T] bool.
    kind: see `kl_penalty` (static).
    loss_agg_mode, num_tokens_global, num_seqs_global, norm_constant: see
      `aggregate_loss` (static mode).

  Returns:
    LossOutput(loss, {"kl": token mean of the estimate, "kl_k1": token mean of k1}).
  """
  chex.assert_rank([logprob, logprob_ref, response_mask], 2)
  m_BT = jnp.asarray(response_mask).astype(bool)
  lp = jnp.where(m_BT, jnp.asarray(logprob, F32), 0.0)
  ref = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(logprob_ref, F32)), 0.0)
  kl_BT = kl_penalty(lp, ref, kind)
  loss = aggregate_loss(kl_BT, m_BT, loss_agg_mode, num_tokens_global=num_tokens_global,
                        num_seqs_global=num_seqs_global, norm_constant=norm_constant)
  n = token_count(m_BT)
  d = jax.lax.stop_gradient(jnp.clip(lp - ref, -LOG_CLAMP, LOG_CLAMP))
  metrics = {"kl": jax.lax.stop_gradient(jnp.sum(jnp.where(m_BT, kl_BT, 0.0)) / n),
             "kl_k1": jnp.sum(jnp.where(m_BT, d, 0.0)) / n}
  return LossOutput(loss, metrics)


def kl_in_reward(*, token_reward: ArrayLike, logprob_old: ArrayLike, logprob_ref: ArrayLike,
                 coef: ArrayLike = 0.001, kind: str = "k1",
                 response_mask: ArrayLike | None = None) -> Array:
  """PPO / REINFORCE++ KL-in-reward: r_t − β·kl(log π_old, log π_ref)_t (P5).

  verl `apply_kl_penalty` / `compute_rewards` (k1: token_reward − β(log π_old − log π_ref)).
  Everything here is stop-gradient: it shapes the reward, not the loss.

  Args:
    token_reward: [B,T] per-token rewards (outcome at the last token).
    logprob_old: [B,T] behaviour-policy log-probs.
    logprob_ref: [B,T] reference log-probs.
    coef: β (a traced scalar is fine, e.g. from an adaptive KL controller).
    kind: KL estimator (see `kl_penalty`), static.
    response_mask: optional [B,T] bool; outside it the result is exactly 0.

  Returns:
    [B,T] float32 shaped rewards.
  """
  r = jax.lax.stop_gradient(jnp.asarray(token_reward, F32))
  lp_old = jax.lax.stop_gradient(jnp.asarray(logprob_old, F32))
  ref = jax.lax.stop_gradient(jnp.asarray(logprob_ref, F32))
  chex.assert_rank([r, lp_old, ref], 2)
  chex.assert_equal_shape([r, lp_old, ref])
  if response_mask is None:
    return r - coef * kl_penalty(lp_old, ref, kind)
  m_BT = jnp.asarray(response_mask).astype(bool)
  kl_BT = kl_penalty(jnp.where(m_BT, lp_old, 0.0), jnp.where(m_BT, ref, 0.0), kind)
  return jnp.where(m_BT, r - coef * kl_BT, 0.0)
