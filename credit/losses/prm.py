"""Objectives that train an implicit process reward model (PRM) from outcome labels only.

The PRM π_φ is a language model; its reward for a response y is the scaled log-ratio to a
frozen reference, r_φ(y) = β Σ_t (log π_φ(y_t) − log π_ref(y_t)) (sum over the valid
tokens). Any outcome-reward objective on r_φ trains a PRM "for free": the partial sums of
the same log-ratio are its process rewards (`credit.advantages.implicit.implicit_prm`).

Paper: "Free Process Rewards without Process Labels" (Yuan et al.), arXiv 2412.01981;
PRIME (Cui et al.), arXiv 2502.01456, trains the PRM online with `prm_ce_loss`.
The losses are code-verified against PRIME-RL/ImplicitPRM `train/openrlhf/models/loss.py`
(`DPOLoss`, `KTOLoss`, `VanillaKTOLoss`), `train/openrlhf/trainer/ce_trainer.py` and
PRIME-RL/PRIME `core_algos.compute_ce_dpo_loss_rm`. That repository has no NCA loss, so
none is offered here.

Every loss takes the PRM's per-token log-probs `logprob_prm` (the gradient flows into them
only), the reference's `logprob_ref` (stop-gradient) and `response_mask`; labels are the
contract's `reward` (1 correct, 0 incorrect). Rows whose mask selects nothing take no part
(masking a row equals removing it). Each returns `LossOutput(loss, metrics)`.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import F32
from credit.losses.reduction import LossOutput

__all__ = ["prm_sequence_logratio", "prm_ce_loss", "prm_dpo_loss", "prm_kto_loss",
           "prm_vanilla_kto_loss"]

Array = jax.Array


def prm_sequence_logratio(*, logprob_prm: ArrayLike, logprob_ref: ArrayLike,
                          response_mask: ArrayLike) -> tuple[Array, Array]:
  """(Σ_t m_t (log π_φ − log π_ref) [B], row has a valid token [B] bool).

  The reference side is stop-gradient; masked entries (even NaN) contribute exactly 0.
  """
  mask = jnp.asarray(response_mask)
  prm = jnp.asarray(logprob_prm, F32)
  ref = jnp.asarray(logprob_ref, F32)
  chex.assert_rank([mask, prm, ref], 2)
  chex.assert_equal_shape([mask, prm, ref])
  mask = mask.astype(bool)
  lr = jnp.where(mask, prm - jax.lax.stop_gradient(ref), 0.0)
  return jnp.sum(lr, axis=-1), jnp.any(mask, axis=-1)


def _labels(fn: str, reward: ArrayLike, batch: int) -> Array:
  r = jnp.asarray(reward, F32)
  chex.assert_shape(r, (batch,))
  return jax.lax.stop_gradient(r)


def _mean(x: Array, w: Array) -> Array:
  return jnp.sum(jnp.where(w > 0, x * w, 0.0)) / jnp.maximum(jnp.sum(w), 1.0)


def prm_ce_loss(*, logprob_prm: ArrayLike, logprob_ref: ArrayLike, response_mask: ArrayLike,
                reward: ArrayLike, beta: ArrayLike = 0.05) -> LossOutput:
  """Cross-entropy of the implicit outcome reward against the outcome label.

  .. math::
    s_i = β Σ_t (log π_φ − log π_ref)(y_{i,t}),
    L = −mean_i [ l_i log σ(s_i) + (1 − l_i) log σ(−s_i) ]

  Code-verified (PRIME `compute_ce_dpo_loss_rm`: BCE(σ(β Σ q), acc); ImplicitPRM
  `CETrainer.loss_fn`). Written with log-sigmoid (the torch BCE clamps log at −100).
  PRIME's online update uses β = 0.05 (`beta_train`). Soft labels in [0,1] are accepted.

  Args:
    logprob_prm: [B,T] float PRM log-prob of the sampled tokens (differentiated).
    logprob_ref: [B,T] float reference log-probs.
    response_mask: [B,T] bool.
    reward: [B] float labels l ∈ [0,1].
    beta: β.

  Returns:
    LossOutput; metrics `prm_accuracy` (sign of s agrees with l ≥ 0.5), `prm_score_mean`
    (mean s), `prm_score_correct`, `prm_score_incorrect` (mean s by label; 0 if none).
  """
  lr_B, valid_B = prm_sequence_logratio(logprob_prm=logprob_prm, logprob_ref=logprob_ref,
                                        response_mask=response_mask)
  l_B = _labels("prm_ce_loss", reward, lr_B.shape[0])
  s_B = jnp.asarray(beta, F32) * lr_B
  nll_B = -(l_B * jax.nn.log_sigmoid(s_B) + (1.0 - l_B) * jax.nn.log_sigmoid(-s_B))
  w_B = valid_B.astype(F32)
  sg = jax.lax.stop_gradient(s_B)
  good_B = l_B >= 0.5
  metrics = {
      "prm_accuracy": _mean(((sg > 0) == good_B).astype(F32), w_B),
      "prm_score_mean": _mean(sg, w_B),
      "prm_score_correct": _mean(sg, w_B * good_B),
      "prm_score_incorrect": _mean(sg, w_B * ~good_B),
  }
  return LossOutput(_mean(nll_B, w_B), metrics)


def prm_dpo_loss(*, logprob_prm: ArrayLike, logprob_ref: ArrayLike, response_mask: ArrayLike,
                 chosen_index: ArrayLike, rejected_index: ArrayLike,
                 pair_mask: ArrayLike | None = None, beta: ArrayLike = 0.05) -> LossOutput:
  """DPO on the implicit reward: pairs (chosen, rejected) of rows of the batch.

  .. math::
    L = −mean_p log σ(β [ (Σ log π_φ/π_ref)(y_{w_p}) − (Σ log π_φ/π_ref)(y_{l_p}) ])

  Code-verified (ImplicitPRM `DPOLoss`, label smoothing 0, no IPO).

  Args:
    logprob_prm, logprob_ref, response_mask: as `prm_ce_loss`.
    chosen_index: [P] int row index of each pair's preferred response.
    rejected_index: [P] int row index of its dispreferred response.
    pair_mask: optional [P] bool; pairs off here, or with an empty row, take no part.
    beta: β.

  Returns:
    LossOutput; metrics `prm_pair_accuracy` (chosen scored higher), `prm_margin_mean`.
  """
  lr_B, valid_B = prm_sequence_logratio(logprob_prm=logprob_prm, logprob_ref=logprob_ref,
                                        response_mask=response_mask)
  ci = jnp.asarray(chosen_index)
  ri = jnp.asarray(rejected_index)
  chex.assert_rank([ci, ri], 1)
  chex.assert_type([ci, ri], int)
  chex.assert_equal_shape([ci, ri])
  nb = lr_B.shape[0]
  ok = (ci >= 0) & (ci < nb) & (ri >= 0) & (ri < nb)
  ci, ri = jnp.clip(ci, 0, nb - 1), jnp.clip(ri, 0, nb - 1)
  ok = ok & valid_B[ci] & valid_B[ri]
  if pair_mask is not None:
    pm = jnp.asarray(pair_mask)
    chex.assert_equal_shape([pm, ci])
    ok = ok & pm.astype(bool)
  margin_P = jnp.asarray(beta, F32) * (lr_B[ci] - lr_B[ri])
  w_P = ok.astype(F32)
  sg = jax.lax.stop_gradient(margin_P)
  metrics = {"prm_pair_accuracy": _mean((sg > 0).astype(F32), w_P),
             "prm_margin_mean": _mean(sg, w_P)}
  return LossOutput(_mean(-jax.nn.log_sigmoid(margin_P), w_P), metrics)


def prm_kto_loss(*, logprob_prm: ArrayLike, logprob_ref: ArrayLike, response_mask: ArrayLike,
                 reward: ArrayLike, beta: ArrayLike = 0.05, desirable_weight: ArrayLike = 1.0,
                 undesirable_weight: ArrayLike = 1.0,
                 kl_reference: ArrayLike | None = None) -> LossOutput:
  """KTO on the implicit reward (uneven sampling), with a detached KL reference point.

  .. math::
    z = max(KL, 0) (stop-gradient),   ρ_i = Σ_t (log π_φ − log π_ref)(y_{i,t})
    desirable (l_i ≥ 0.5):    λ_D (1 − σ(β (ρ_i − z)))
    undesirable:              λ_U (1 − σ(β (z − ρ_i)))
    L = mean over all valid rows of the weighted terms

  Code-verified (ImplicitPRM `KTOLoss`; the reference point is inside β, and the trainer
  uses λ_D = λ_U = 1). KL there is the mean log-ratio of *mismatched* (prompt, response)
  pairs, all-reduced over devices: pass it as `kl_reference` (a scalar). Without it
  (ours) z is the mean ρ over the batch's valid rows, a cheaper stand-in.

  Args:
    logprob_prm, logprob_ref, response_mask, reward: as `prm_ce_loss` (l = `reward`).
    beta: β.
    desirable_weight, undesirable_weight: λ_D, λ_U.
    kl_reference: optional scalar KL estimate (clamped at 0, stop-gradient).

  Returns:
    LossOutput; metrics `prm_kl` (z), `prm_score_correct`, `prm_score_incorrect`.
  """
  lr_B, valid_B = prm_sequence_logratio(logprob_prm=logprob_prm, logprob_ref=logprob_ref,
                                        response_mask=response_mask)
  l_B = _labels("prm_kto_loss", reward, lr_B.shape[0])
  w_B = valid_B.astype(F32)
  kl = _mean(lr_B, w_B) if kl_reference is None else jnp.asarray(kl_reference, F32)
  chex.assert_rank(kl, 0)
  z = jnp.maximum(jax.lax.stop_gradient(kl), 0.0)
  b = jnp.asarray(beta, F32)
  good_B = l_B >= 0.5
  term_B = jnp.where(good_B,
                     jnp.asarray(desirable_weight, F32) * (1.0 - jax.nn.sigmoid(b * (lr_B - z))),
                     jnp.asarray(undesirable_weight, F32)
                     * (1.0 - jax.nn.sigmoid(b * (z - lr_B))))
  sg = jax.lax.stop_gradient(b * lr_B)
  metrics = {"prm_kl": z, "prm_score_correct": _mean(sg, w_B * good_B),
             "prm_score_incorrect": _mean(sg, w_B * ~good_B)}
  return LossOutput(_mean(term_B, w_B), metrics)


def prm_vanilla_kto_loss(*, logprob_prm: ArrayLike, logprob_ref: ArrayLike,
                         response_mask: ArrayLike, reward: ArrayLike,
                         beta: ArrayLike = 0.05,
                         stop_reference_gradient: bool = False) -> LossOutput:
  """"Vanilla" KTO (even sampling): each class is referenced to the other class's mean.

  .. math::
    z_D = max(mean_{desirable} ρ, 0),   z_U = max(mean_{undesirable} ρ, 0)
    desirable:    1 − σ(β (ρ_i − z_U));    undesirable:  1 − σ(β (z_D − ρ_i))
    L = mean over the concatenated terms of both classes

  Code-verified (ImplicitPRM `VanillaKTOLoss`). There the reference points are *not*
  detached, so the gradient also flows through them (`stop_reference_gradient=False`);
  True detaches them as `prm_kto_loss` does. An empty class gives z = 0 (the code would
  produce NaN).

  Args:
    logprob_prm, logprob_ref, response_mask, reward: as `prm_ce_loss`.
    beta: β.
    stop_reference_gradient: static; detach z_D and z_U.

  Returns:
    LossOutput; metrics `prm_kl_correct` (z_D), `prm_kl_incorrect` (z_U).
  """
  lr_B, valid_B = prm_sequence_logratio(logprob_prm=logprob_prm, logprob_ref=logprob_ref,
                                        response_mask=response_mask)
  l_B = _labels("prm_vanilla_kto_loss", reward, lr_B.shape[0])
  w_B = valid_B.astype(F32)
  good_B = l_B >= 0.5
  z_good = jnp.maximum(_mean(lr_B, w_B * good_B), 0.0)
  z_bad = jnp.maximum(_mean(lr_B, w_B * ~good_B), 0.0)
  if stop_reference_gradient:
    z_good, z_bad = jax.lax.stop_gradient(z_good), jax.lax.stop_gradient(z_bad)
  b = jnp.asarray(beta, F32)
  term_B = jnp.where(good_B, 1.0 - jax.nn.sigmoid(b * (lr_B - z_bad)),
                     1.0 - jax.nn.sigmoid(b * (z_good - lr_B)))
  metrics = {"prm_kl_correct": jax.lax.stop_gradient(z_good),
             "prm_kl_incorrect": jax.lax.stop_gradient(z_bad)}
  return LossOutput(_mean(term_B, w_B), metrics)
