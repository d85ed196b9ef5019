"""VERPO: evidence-conditioned self-teacher corrections, accepted, localised and cost-scaled."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.distill._steps import clean_logprobs, grpo_rows
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["verpo_advantages"]

_PAPER = ("VERPO: evidence-conditioned guidance with a Fisher Evidence Contrast, arXiv "
          "preprint (abstract only; id not retrieved)")


# Per row, the k largest scores among the accepted tokens (ties: the earlier token), [B,T]
# bool. Jitted on its own (inlined under the caller's jit): run eagerly, the radix select
# of `ops.smallest_k_mask` would be dispatched op by op (~5 s on CPU for a doctest).
_kept_per_row = jax.jit(lambda score_BT, accepted_BT, k_B: jax.vmap(ops.smallest_k_mask)(
    -score_BT, k_B, accepted_BT))


@register_estimator(
    "verpo", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "use_alt_reference",
                                   "group_std"),
    optional_needs={"logprob_alt": "use_alt_reference"})
def verpo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                     logprob_old: ArrayLike, logprob_teacher: ArrayLike, num_groups: int,
                     group_size: int | None = None, logprob_alt: ArrayLike | None = None,
                     use_alt_reference: bool = False, rho: ArrayLike = 0.2,
                     lambda_fisher: ArrayLike = 1.0, gamma0: ArrayLike = 0.0,
                     gamma1: ArrayLike = 1.0,
                     group_std: Literal["unbiased", "population", "none"] = "unbiased",
                     eps: ArrayLike = 1e-6) -> Array:
  """VERPO: GRPO plus evidence corrections kept where they agree with the outcome, on few tokens.

  Confidence: inferred (from the abstract; the formula is the spec's design,
  `shared/methods/distill_and_structure.md` A10, every hyperparameter a choice). The
  abstract splits the guidance of an evidence-conditioned self-teacher into an
  evidence-free reference term and a signed evidence-induced correction per token,
  accepts a correction only where it agrees with the local policy-gradient direction,
  keeps it on a few tokens only and scales it by alignment against movement cost.
  Searches (pages, 2026: "VERPO evidence-conditioned guidance", "Fisher Evidence
  Contrast") found neither the paper's equations nor code.

  .. math::
    a⁰_t = ℓ⁰_t − ℓˢ_t,    e_t = ℓᴱ_t − ℓ⁰_t
    acc_t = [sign(e_t) = sign(Â_b)] ∧ Â_b ≠ 0
    loc_t = [t among the max(1, ⌊ρ n_b⌋) largest |e| of the accepted tokens of row b]
    s_t = min(1, |Â_b| |e_t| / (λ_F p_t (1 − p_t) + 1e-6)),    p_t = exp(ℓˢ_t)
    A_{b,t} = Â_b + γ₀ a⁰_t + γ₁ acc_t loc_t s_t e_t

  ℓˢ = `logprob_old` (the student), ℓᴱ = `logprob_teacher` (the policy conditioned on
  the verified evidence), n_b the row's number of valid tokens. ℓ⁰ is the evidence-free
  teacher context: by default (ours) the plain context itself, ℓ⁰ = ℓˢ, so a⁰ = 0 and
  e = ℓᴱ − ℓˢ; with `use_alt_reference=True`, ℓ⁰ = `logprob_alt` (a separate pass
  scoring the tokens under the teacher prompt without the evidence). The cost scale uses
  the Fisher information p(1 − p) of a categorical logit as the cost of moving the token.

  Out of scope: the paper's Fisher Evidence Contrast projects updates in representation /
  gradient space along an "evidence presence" direction; it needs hidden states or
  per-token gradients, not log-probs of sampled tokens, so it is a model-side hook and not
  an array function of this contract.

  Choices (ours): ρ = 0.2, λ_F = 1, γ₀ = 0, γ₁ = 1; the "local direction" is the sign of
  the row's GRPO advantage; localisation by `credit.ops.smallest_k_mask` on −|e| per row
  (no sort; ties go to the earlier token); log-probs clamped at −20; Â_b is GRPO
  (unbiased group std, singleton group 0). An all-equal or singleton group (Â = 0)
  accepts no correction, so with γ₀ = 0 it gets exact zeros.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group of each row in [0, num_groups); unused (may be None) when
      `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student log-prob ℓˢ of the sampled token.
    logprob_teacher: [B,T] float evidence-conditioned log-prob ℓᴱ of it.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    logprob_alt: [B,T] float evidence-free teacher log-prob ℓ⁰; read only with
      `use_alt_reference`.
    use_alt_reference: static, ℓ⁰ = `logprob_alt` instead of ℓˢ.
    rho: ρ, fraction of a row's tokens that may carry a correction (at least one).
    lambda_fisher: λ_F. gamma0, gamma1: γ₀, γ₁.
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

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
