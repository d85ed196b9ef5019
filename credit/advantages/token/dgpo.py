"""DGPO: Hellinger deviation × entropy gate redistributes the GRPO sequence advantage."""
from __future__ import annotations

import math
from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.advantages.token._redistribute import (mix_with_uniform, normalize_budget,
                                                   redistribute)
from credit.ops.baselines import sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["dgpo_advantages", "dgpo_weights"]

_PAPER = ("DGPO: Distribution-Guided Policy Optimization for Fine-Grained Credit Assignment "
          "(Jin et al.), arXiv 2605.03327")
_WEIGHTINGS = ("softmax", "linear")
_GROUP_STDS = ("unbiased", "population")
_GATES = ("log_vocab", "row_mean")


def _check_gate(fn: str, gate: str, vocab_size: int | None) -> None:
  """Eager: the paper's gate H/log|V| needs the vocabulary size."""
  check_choice(fn, "gate", gate, _GATES)
  if gate == "log_vocab":
    if vocab_size is None:
      raise ValueError(
          f"{fn}: gate='log_vocab' (the paper's H_t / log|V|, the default) needs `vocab_size`, "
          "the policy's vocabulary size (the model config's vocab_size, i.e. the number of "
          "logits the entropy is taken over); set it (e.g. --config.estimator_kwargs."
          "vocab_size=<V>), or pass gate='row_mean' for the per-response mean gate")
    check_int(fn, "vocab_size", vocab_size, minimum=2)
  elif vocab_size is not None:
    check_int(fn, "vocab_size", vocab_size, minimum=2)


def _token_inputs(response_mask, logprob_old, logprob_ref, entropy, hellinger):
  """[B,T] arrays with shape asserts; values outside the mask replaced by 0 (NaN-safe)."""
  mask_BT = jnp.asarray(response_mask)
  lp_old_BT = jnp.asarray(logprob_old, jnp.float32)
  lp_ref_BT = jnp.asarray(logprob_ref, jnp.float32)
  ent_BT = jnp.asarray(entropy, jnp.float32)
  arrays = [mask_BT, lp_old_BT, lp_ref_BT, ent_BT]
  if hellinger is not None:
    arrays.append(jnp.asarray(hellinger, jnp.float32))
  chex.assert_rank(arrays, 2)
  chex.assert_equal_shape(arrays)
  mask_BT = mask_BT.astype(bool)
  clean = [jnp.where(mask_BT, a, 0.0) for a in arrays[1:]]
  hel_BT = clean[3] if hellinger is not None else None
  return mask_BT, clean[0], clean[1], clean[2], hel_BT


def _scores(mask_BT, lp_old_BT, lp_ref_BT, ent_BT, hel_BT, gate_power, gate, vocab_size, eps):
  """Gated deviation score s = d · g^κ ≥ 0 on valid tokens, 0 elsewhere (no gradient)."""
  if hel_BT is None:
    # (√π − √π_ref)² from log-probs, e^{ℓ/2} rather than √e^{ℓ}: finite gradients at π → 0.
    dev_BT = jnp.square(jnp.exp(0.5 * lp_old_BT) - jnp.exp(0.5 * lp_ref_BT))
  else:
    dev_BT = jnp.clip(hel_BT, 0.0, 1.0)
  ent_BT = jnp.maximum(ent_BT, 0.0)
  if gate == "row_mean":
    norm_B = ops.masked_mean(ent_BT, mask_BT, axis=-1) + eps
    gate_BT = ent_BT / norm_B[:, None]
  else:
    gate_BT = jnp.clip(ent_BT / math.log(vocab_size), 0.0, 1.0)
  gate_BT = jnp.power(gate_BT, jnp.asarray(gate_power, jnp.float32))
  return jax.lax.stop_gradient(jnp.where(mask_BT, dev_BT * gate_BT, 0.0))


def _softmax_budget(score_BT: Array, mask_BT: Array, temperature) -> Array:
  """L_b · softmax_t(s/τ) over the valid tokens of each row (0 elsewhere)."""
  z_BT = jnp.where(mask_BT, score_BT / jnp.asarray(temperature, jnp.float32), 0.0)
  zmax_B = jnp.max(jnp.where(mask_BT, z_BT, -jnp.inf), axis=-1)
  zmax_B = jnp.where(jnp.any(mask_BT, axis=-1), zmax_B, 0.0)
  e_BT = jnp.where(mask_BT, jnp.exp(z_BT - zmax_B[:, None]), 0.0)
  return normalize_budget(e_BT, mask_BT)


def dgpo_weights(*, response_mask: ArrayLike, logprob_old: ArrayLike, logprob_ref: ArrayLike,
                 entropy: ArrayLike, weighting: Literal["softmax", "linear"] = "softmax",
                 temperature: ArrayLike = 0.5, alpha: ArrayLike = 0.5,
                 gate_power: ArrayLike = 1.0, vocab_size: int | None = None,
                 gate: Literal["log_vocab", "row_mean"] = "log_vocab",
                 eps: ArrayLike = 1e-6, hellinger: ArrayLike | None = None) -> Array:
  """DGPO token weights w[b,t] ≥ 0 with Σ_t w = L_b (see `dgpo_advantages`).

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float behaviour-policy log-prob of the sampled token.
    logprob_ref: [B,T] float reference log-prob of the sampled token.
    entropy: [B,T] float policy entropy.
    weighting: static, "softmax" | "linear".
    temperature: τ of "softmax".
    alpha: α of "linear".
    gate_power: κ, exponent of the entropy gate.
    vocab_size: static vocabulary size V of the gate H/log V (`gate="log_vocab"`).
    gate: static, "log_vocab" | "row_mean".
    eps: the gate's and the linear mixture's ε.
    hellinger: optional [B,T] full-vocabulary squared Hellinger distances.

  Returns:
    [B,T] float32 weights (no gradient), 0 outside the mask; rows sum to their length.
  """
  check_choice("dgpo_weights", "weighting", weighting, _WEIGHTINGS)
  _check_gate("dgpo_weights", gate, vocab_size)
  mask_BT, lp_old_BT, lp_ref_BT, ent_BT, hel_BT = _token_inputs(
      response_mask, logprob_old, logprob_ref, entropy, hellinger)
  s_BT = _scores(mask_BT, lp_old_BT, lp_ref_BT, ent_BT, hel_BT, gate_power, gate, vocab_size,
                 eps)
  if weighting == "softmax":
    w_BT = _softmax_budget(s_BT, mask_BT, temperature)
  else:
    w_BT = mix_with_uniform(s_BT, mask_BT, alpha=alpha, prior=eps)
  return jax.lax.stop_gradient(w_BT)


@register_estimator(
    "dgpo", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_ref",
                   "entropy"),
    paper=_PAPER, optional_needs={"hellinger_ref": "exact_hellinger"},
    static_argnames=("num_groups", "group_size", "weighting", "group_std", "vocab_size",
                     "gate", "exact_hellinger"),
                    confidence="paper-equation",
                    source=(_PAPER + "; its equations as quoted by third-party write-ups "
                            "(erikqu/tiny-dgpo README and dgpo.py)"))
def dgpo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                    response_mask: ArrayLike, logprob_old: ArrayLike, logprob_ref: ArrayLike,
                    entropy: ArrayLike, num_groups: int, group_size: int | None = None,
                    weighting: Literal["softmax", "linear"] = "softmax",
                    temperature: ArrayLike = 0.5, alpha: ArrayLike = 0.5,
                    gate_power: ArrayLike = 1.0, vocab_size: int | None = None,
                    gate: Literal["log_vocab", "row_mean"] = "log_vocab",
                    group_std: Literal["unbiased", "population"] = "unbiased",
                    eps: ArrayLike = 1e-6, exact_hellinger: bool = False,
                    hellinger_ref: ArrayLike | None = None) -> Array:
  """DGPO: the GRPO sequence advantage redistributed by an entropy-gated Hellinger deviation.

  DGPO drops the KL penalty and uses the deviation from the reference as a credit signal:
  tokens where the policy has moved away from the reference while still uncertain get more
  of the response's advantage. Use a policy loss without a KL term. With Â_b the GRPO
  advantage and H_t the policy entropy::

    d_t = 1 − Σ_v sqrt(π(v) π_ref(v))              (squared Hellinger distance, in [0, 1])
    s_t = d_t · (H_t / log|V|)^κ
    w_t = L_b · softmax_t(s_t / τ),    A[b,t] = Â_b · w_t

  The weights keep each response's total credit (Σ_t w_t = L_b) and its sign, carry no
  gradient, and reduce to GRPO when the policy equals the reference.

  Paper: "DGPO: Distribution-Guided Policy Optimization for Fine-Grained Credit
  Assignment", arXiv 2605.03327 (τ = 0.5, κ = 1).

  Differences: without `hellinger_ref` the distance is the sampled-token proxy
  (√π_t − √π_ref,t)², so no full-vocabulary pass is needed (`exact_hellinger=True` makes
  the runner produce the exact one); π is the behaviour policy, so the weights are fixed
  for the PPO epochs of a batch. `weighting="linear"` and `gate="row_mean"` are an
  alternative of this library's, documented on the method's page.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float behaviour-policy log-prob of the sampled token.
    logprob_ref: [B,T] float reference log-prob of the sampled token.
    entropy: [B,T] float policy entropy at each position (nats).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    weighting: static, "softmax" (paper) | "linear".
    temperature: τ > 0 of "softmax".
    alpha: α ∈ [0,1] of "linear" (0 is GRPO).
    gate_power: κ ≥ 0 (0: deviation only).
    vocab_size: the model's vocabulary size V (static), required by `gate="log_vocab"`.
    gate: static, "log_vocab" (paper) | "row_mean".
    group_std: static, "unbiased" | "population".
    eps: added to σ_g and used by the gate and the linear mixture.
    exact_hellinger: static; use `hellinger_ref` (then required).
    hellinger_ref: optional [B,T] full-vocabulary squared Hellinger distances.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> pi, ref = np.array([0.9, 0.3, 0.6, 0.05]), np.array([0.9, 0.6, 0.3, 0.05])
    >>> row = lambda x: np.tile(np.asarray(x, np.float32), (2, 1))
    >>> a = dgpo_advantages(reward=np.array([1., 0.]), group_id=np.zeros(2, np.int32),
    ...                     response_mask=np.ones((2, 4), bool),
    ...                     logprob_old=row(np.log(pi)), logprob_ref=row(np.log(ref)),
    ...                     entropy=row([0.1, 1.2, 0.8, 2.0]), num_groups=1,
    ...                     weighting="linear", gate="row_mean", group_std="population")
    >>> np.round(np.asarray(a, np.float64), 3).tolist()
    [[0.5, 1.7, 1.3, 0.5], [-0.5, -1.7, -1.3, -0.5]]
  """
  check_choice("dgpo_advantages", "weighting", weighting, _WEIGHTINGS)
  check_choice("dgpo_advantages", "group_std", group_std, _GROUP_STDS)
  _check_gate("dgpo_advantages", gate, vocab_size)
  if exact_hellinger and hellinger_ref is None:
    raise ValueError("dgpo_advantages: exact_hellinger=True needs `hellinger_ref` [B,T] (the "
                     "full-vocabulary squared Hellinger distance to the reference, e.g. "
                     "credit.divergences.model_divergence(kind='hellinger')); "
                     "exact_hellinger=False uses the sampled-token proxy")
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "dgpo_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  adv_B = sequence_advantage(reward_B, gid_B, valid_B, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  w_BT = dgpo_weights(response_mask=mask_BT, logprob_old=logprob_old, logprob_ref=logprob_ref,
                      entropy=entropy, weighting=weighting, temperature=temperature,
                      alpha=alpha, gate_power=gate_power, vocab_size=vocab_size, gate=gate,
                      eps=eps, hellinger=hellinger_ref)
  return redistribute(adv_B, w_BT, mask_BT, renormalize=False)
