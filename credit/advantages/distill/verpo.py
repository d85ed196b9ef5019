"""VERPO: evidence-conditioned self-teacher corrections, accepted, localised and cost-scaled."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.distill._steps import clean_logprobs, grpo_rows
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["verpo_advantages", "evidence_nuisance"]

_PAPER = "VERPO: evidence-conditioned guidance with a Fisher Evidence Contrast, arXiv preprint"


# Per row, the k largest scores among the accepted tokens (ties: the earlier token), [B,T]
# bool. Jitted on its own (inlined under the caller's jit): run eagerly, the row-wise
# select would be dispatched op by op.
_kept_per_row = jax.jit(lambda score_BT, accepted_BT, k_B: ops.row_smallest_k_mask(
    -score_BT, k_B, accepted_BT))


def evidence_nuisance(*, hidden_plain: ArrayLike, hidden_evidence: ArrayLike,
                      unembed: ArrayLike, tokens: ArrayLike, mask: ArrayLike,
                      fec_lambda: ArrayLike = 1e-2, chunk_size: int | None = None) -> Array:
  """[B,T] the part of each token's evidence-induced log-prob shift along the evidence-presence direction.

  VERPO's Fisher Evidence Contrast (FEC) removes "nuisance shifts along an estimated
  evidence-presence direction through a regularized projection". This library's
  construction, from the hidden states h⁰_t and hᴱ_t that predict token y_t without and
  with the evidence in the context (`credit.scoring.next_token_hidden`)::

    u_t = hᴱ_t − h⁰_t,   m = mean_t u_t,   v = m / norm(m),   κ = norm(m)² / (norm(m)² + λ)
    g_t = W_{y_t} − Σ_y p⁰_t(y) W_y        (the gradient of log p(y_t | h) at h⁰_t)
    n_t = κ (g_t · v)(u_t · v)

  m, the shift every token shares, estimates "evidence present" (style, confidence: the
  nuisance); n_t is the part of the log-prob correction ℓᴱ_t − ℓ⁰_t carried by that
  direction, to first order. `verpo_advantages(fec=True)` subtracts it.

  Args:
    hidden_plain: [B,T,D] predicting hidden states without the evidence.
    hidden_evidence: [B,T,D] the same with the evidence.
    unembed: [D,V] the output embedding.
    tokens: [B,T] int the sampled tokens y_t.
    mask: [B,T] bool the tokens taken into account (0 elsewhere in the output).
    fec_lambda: λ ≥ 0.
    chunk_size: static positions per chunk of the [B,·,V] softmax (None: all at once).

  Returns:
    [B,T] float32 n_t (no gradient), 0 outside `mask`.
  """
  h0 = jnp.asarray(hidden_plain, jnp.float32)
  he = jnp.asarray(hidden_evidence, jnp.float32)
  w = jnp.asarray(unembed, jnp.float32)
  tok = jnp.asarray(tokens)
  m_BT = jnp.asarray(mask).astype(bool)
  chex.assert_rank([h0, he, w], [3, 3, 2])
  chex.assert_equal_shape([h0, he])
  chex.assert_shape([tok, m_BT], h0.shape[:2])
  u = jnp.where(m_BT[..., None], he - h0, 0.0)
  n = jnp.maximum(jnp.sum(m_BT.astype(jnp.float32)), 1.0)
  mean = jnp.sum(u, axis=(0, 1)) / n
  sq = jnp.sum(mean * mean)
  v = mean / jnp.sqrt(jnp.maximum(sq, 1e-30))
  kappa = sq / (sq + jnp.asarray(fec_lambda, jnp.float32))
  u_v = u @ v                                        # [B,T]
  w_v = v @ w                                        # [V]: each token's embedding along v
  T = h0.shape[1]
  c = T if chunk_size is None else max(1, min(int(chunk_size), T))
  pad = (-T) % c
  h_c = jnp.pad(h0, ((0, 0), (0, pad), (0, 0))).reshape(h0.shape[0], -1, c, h0.shape[2])

  def expected_wv(h_BCD):  # Σ_y p(y) (W_y · v) at each position of a chunk
    return jax.nn.softmax(h_BCD @ w, axis=-1) @ w_v

  ew = jax.lax.map(expected_wv, jnp.moveaxis(h_c, 1, 0))       # [chunks, B, c]
  ew = jnp.moveaxis(ew, 0, 1).reshape(h0.shape[0], -1)[:, :T]
  g_v = w_v[jnp.clip(tok, 0, w.shape[1] - 1)] - ew
  return jax.lax.stop_gradient(jnp.where(m_BT, kappa * g_v * u_v, 0.0))


@register_estimator(
    "verpo", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "use_alt_reference",
                                   "group_std", "fec"),
    optional_needs={"logprob_alt": "use_alt_reference", "evidence_nuisance": "fec"},
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def verpo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                     logprob_old: ArrayLike, logprob_teacher: ArrayLike, num_groups: int,
                     group_size: int | None = None, logprob_alt: ArrayLike | None = None,
                     use_alt_reference: bool = False, evidence_nuisance: ArrayLike | None = None,
                     fec: bool = False, rho: ArrayLike = 0.2,
                     lambda_fisher: ArrayLike = 1.0, gamma0: ArrayLike = 0.0,
                     gamma1: ArrayLike = 1.0,
                     group_std: Literal["unbiased", "population", "none"] = "unbiased",
                     eps: ArrayLike = 1e-6) -> Array:
  """VERPO: GRPO plus evidence corrections kept where they agree with the outcome, on few tokens.

  An evidence-conditioned self-teacher's guidance splits into an evidence-free reference
  term and a signed evidence-induced correction per token; a correction is accepted only
  where it agrees with the local policy-gradient direction, kept on a few tokens, and
  scaled by alignment against the cost of moving the token::

    a⁰_t = ℓ⁰_t − ℓˢ_t,    e_t = ℓᴱ_t − ℓ⁰_t
    acc_t = [sign(e_t) = sign(Â_b)] and Â_b ≠ 0
    loc_t = [t among the max(1, ⌊ρ n_b⌋) largest abs(e) of the row's accepted tokens]
    s_t = min(1, abs(Â_b) abs(e_t) / (λ_F p_t (1 − p_t) + 1e-6)),    p_t = exp(ℓˢ_t)
    A[b,t] = Â_b + γ₀ a⁰_t + γ₁ acc_t loc_t s_t e_t

  with ℓˢ = `logprob_old`, ℓᴱ = `logprob_teacher` (the policy given the verified
  evidence) and ℓ⁰ the evidence-free teacher context (ℓˢ by default, `logprob_alt` with
  `use_alt_reference`). `fec=True` first subtracts `evidence_nuisance` from e. An
  all-equal group accepts no correction. The output carries no gradient.

  Paper: "VERPO: evidence-conditioned guidance with a Fisher Evidence Contrast" (arXiv
  preprint). The abstract gives the mechanism but no equation: the formulas and ρ = 0.2,
  λ_F = 1, γ₀ = 0, γ₁ = 1 are this library's reading.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student log-prob ℓˢ of the sampled token.
    logprob_teacher: [B,T] float evidence-conditioned log-prob ℓᴱ of it.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    logprob_alt: [B,T] float evidence-free teacher log-prob ℓ⁰ (`use_alt_reference`).
    use_alt_reference: static, ℓ⁰ = `logprob_alt` instead of ℓˢ.
    evidence_nuisance: [B,T] float n_t (`fec`).
    fec: static, subtract `evidence_nuisance` from the correction.
    rho: ρ, fraction of a row's tokens that may carry a correction (at least one).
    lambda_fisher: λ_F.
    gamma0: γ₀.
    gamma1: γ₁.
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> ls = np.log(np.array([[0.5, 0.5, 0.9]] * 2))
    >>> le = ls + np.array([[-0.4, 0.3, -0.05]] * 2)
    >>> a = verpo_advantages(reward=np.array([0.0, 1.0]), group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 3), bool), logprob_old=ls, logprob_teacher=le,
    ...     num_groups=1, group_std="none")        # Â = ∓0.5
    >>> np.round(np.asarray(a[0], np.float64), 5).tolist()
    [-0.82, -0.5, -0.5]
  """
  if use_alt_reference and logprob_alt is None:
    raise ValueError("verpo_advantages: use_alt_reference=True needs `logprob_alt`")
  if fec and evidence_nuisance is None:
    raise ValueError("verpo_advantages: fec=True needs `evidence_nuisance`")
  rows, adv_B = grpo_rows("verpo_advantages", reward, group_id, response_mask, num_groups,
                          group_size, group_std, eps)
  if use_alt_reference:
    mask_BT, ls_BT, le_BT, l0_BT = clean_logprobs(rows.mask, logprob_old, logprob_teacher,
                                                  logprob_alt)
  else:
    mask_BT, ls_BT, le_BT = clean_logprobs(rows.mask, logprob_old, logprob_teacher)
    l0_BT = ls_BT
  ref_BT = l0_BT - ls_BT
  e_BT = le_BT - l0_BT
  if fec:
    nuis_BT = jnp.asarray(evidence_nuisance, jnp.float32)
    chex.assert_equal_shape([nuis_BT, e_BT])
    e_BT = e_BT - jnp.where(mask_BT & jnp.isfinite(nuis_BT), nuis_BT, 0.0)
  adv_BT = adv_B[:, None]
  accepted_BT = mask_BT & (jnp.sign(e_BT) == jnp.sign(adv_BT)) & (adv_BT != 0)
  n_B = ops.sequence_lengths(mask_BT)
  k_B = jnp.maximum(jnp.floor(jnp.asarray(rho, jnp.float32) * n_B), 1.0).astype(jnp.int32)
  kept_BT = _kept_per_row(jnp.abs(e_BT), accepted_BT, k_B)
  p_BT = jnp.exp(jnp.minimum(ls_BT, 0.0))
  cost_BT = jnp.asarray(lambda_fisher, jnp.float32) * p_BT * (1.0 - p_BT) + 1e-6
  scale_BT = jnp.minimum(1.0, jnp.abs(adv_BT) * jnp.abs(e_BT) / cost_BT)
  out_BT = (adv_BT + jnp.asarray(gamma0, jnp.float32) * ref_BT
            + jnp.asarray(gamma1, jnp.float32) * jnp.where(kept_BT, scale_BT * e_BT, 0.0))
  return jax.lax.stop_gradient(jnp.where(mask_BT, out_BT, 0.0))
