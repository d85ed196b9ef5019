"""T-REG: self-generated token rewards (contrastive prompting) guide the token credit of Â."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.token._redistribute import redistribute, signed_weights
from credit.ops.baselines import GROUP_STDS, sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["treg_advantages", "treg_token_rewards", "treg_regularizer_loss", "treg_pair_weight"]

_PAPER = ("T-REG: Preference Optimization with Token-Level Reward Regularization (Zhou, "
          "Zhang, Zhao, Meng), ACL 2025, arXiv 2412.02685")
_MODES = ("additive", "redistribute")
_FORMS = ("weighted_logprob", "agreement")
_REDUCES = ("sum", "mean")


def treg_token_rewards(*, response_mask: ArrayLike, logprob_alt_pos: ArrayLike,
                       logprob_alt_neg: ArrayLike, scale: ArrayLike = 1.0) -> Array:
  """Self-generated token rewards r̂ = scale · (σ(ℓ⁺ − ℓ⁻) − ½) ∈ (−scale/2, scale/2).

  Confidence: paper-equation (T-REG §Method, via a full-paper digest): r̂_t =
  σ(log π(y_t | x_better, y_<t) − log π(y_t | x_worse, y_<t)) − 0.5 ∈ [−0.5, 0.5], with π the
  frozen *reference* model and x_better / x_worse the prompt under the two contrastive
  revision instructions — so ℓ± are precomputable once per batch. `scale=2` gives the
  earlier (ours) 2σ(Δ) − 1 = tanh(Δ/2) ∈ (−1, 1).

  Args:
    response_mask: [B,T] bool.
    logprob_alt_pos: [B,T] float log-prob of the token under the "improve" prompt.
    logprob_alt_neg: [B,T] float log-prob of the token under the "worsen" prompt.
    scale: multiplier of σ(Δ) − ½ (1.0: the paper's).

  Returns:
    [B,T] float32 token rewards (no gradient), 0 outside the mask.
  """
  mask_BT = jnp.asarray(response_mask)
  pos_BT = jnp.asarray(logprob_alt_pos, jnp.float32)
  neg_BT = jnp.asarray(logprob_alt_neg, jnp.float32)
  chex.assert_rank([mask_BT, pos_BT, neg_BT], 2)
  chex.assert_equal_shape([mask_BT, pos_BT, neg_BT])
  mask_BT = mask_BT.astype(bool)
  diff_BT = jnp.where(mask_BT, pos_BT - neg_BT, 0.0)
  r_BT = jnp.asarray(scale, jnp.float32) * (jax.nn.sigmoid(diff_BT) - 0.5)
  return jax.lax.stop_gradient(jnp.where(mask_BT, r_BT, 0.0))


def treg_pair_weight(*, chosen_logratio: ArrayLike, rejected_logratio: ArrayLike,
                     beta: ArrayLike = 0.1) -> Array:
  """T-REG's sequence weight w = sg σ(r_DPO(x, y_l) − r_DPO(x, y_w)) per pair ([P]).

  r_DPO(x, y) = β Σ_t (log π_θ − log π_ref)(y_t) is DPO's implicit reward, so w is DPO's
  own per-pair gradient weight: the regulariser weighs most where DPO still ranks the
  pair wrongly. The paper's ablation without w ("static weighting") loses most of the gain.

  Args:
    chosen_logratio: [P] float Σ_t (log π_θ − log π_ref) over the chosen response y_w.
    rejected_logratio: [P] float the same over the rejected response y_l.
    beta: DPO β.

  Returns:
    [P] float32 weights in (0, 1), no gradient.
  """
  ch = jnp.asarray(chosen_logratio, jnp.float32)
  rj = jnp.asarray(rejected_logratio, jnp.float32)
  chex.assert_equal_shape([ch, rj])
  return jax.lax.stop_gradient(jax.nn.sigmoid(jnp.asarray(beta, jnp.float32) * (rj - ch)))


def treg_regularizer_loss(*, logprob: ArrayLike, logprob_alt_pos: ArrayLike,
                          logprob_alt_neg: ArrayLike, response_mask: ArrayLike,
                          beta: ArrayLike = 0.1, pair_weight: ArrayLike | None = None,
                          token_reduce: Literal["sum", "mean"] = "sum",
                          form: Literal["weighted_logprob", "agreement"] = "weighted_logprob",
                          logprob_ref: ArrayLike | None = None,
                          temperature: ArrayLike | None = None) -> Array:
  """T-REG's token-level regulariser for preference optimisation, one value per response [B].

  Confidence: paper-equation (T-REG §Method, via a full-paper digest; no code retrieved).
  The paper maximises Σ_t (β log π_θ/π_ref)(y_t) · r̂_t, i.e. (π_ref fixed) a token-weighted
  log-likelihood, `form="weighted_logprob"` (default):

  .. math::
    L_REG(x, y) = − Σ_t β · r̂_t · log π_θ(y_t | x, y_<t)
    L = L_DPO + α · w · (L_REG(x, y_w) + L_REG(x, y_l)),   w = sg σ(r_DPO(y_l) − r_DPO(y_w))

  with α searched in {0.1, 0.25, 0.5} (0.25 a reasonable default) and w from
  `treg_pair_weight` (pass it as `pair_weight`, one value per row: the pair's weight on both
  its chosen and its rejected row). The regulariser applies to both responses of a pair;
  the paper also pairs it with SimPO (SimPO-REG). `token_reduce="mean"` divides by the
  response length instead of summing (the digest writes a sum).

  `form="agreement"` is our earlier design (kept as an option): it asks DPO's token
  rewards ρ_t = β (log π_θ − log π_ref)(y_t) to agree in sign with r̂_t,
  L_b = −(1/L_b) Σ_t log σ(r̂_t ρ_t / β_r), β_r = `temperature` (default β); it needs
  `logprob_ref` and ignores `token_reduce`.

  Gradients flow into `logprob` only. Empty rows give 0.

  Args:
    logprob: [B,T] float policy log-prob of the sampled token (differentiated).
    logprob_alt_pos, logprob_alt_neg: [B,T] float, as in `treg_token_rewards` (reference
      model under the two revision prompts).
    response_mask: [B,T] bool.
    beta: DPO β.
    pair_weight: optional [B] float sequence weight w (stop-gradient).
    token_reduce: static, "sum" (paper) | "mean" ("weighted_logprob" only).
    form: static, "weighted_logprob" (paper) | "agreement" (ours).
    logprob_ref: [B,T] float reference log-prob ("agreement" only).
    temperature: β_r of "agreement" (None: β).

  Returns:
    [B] float32 per-response regulariser.
  """
  check_choice("treg_regularizer_loss", "form", form, _FORMS)
  check_choice("treg_regularizer_loss", "token_reduce", token_reduce, _REDUCES)
  mask_BT = jnp.asarray(response_mask).astype(bool)
  lp_BT = jnp.where(mask_BT, jnp.asarray(logprob, jnp.float32), 0.0)
  chex.assert_equal_shape([mask_BT, lp_BT])
  r_BT = treg_token_rewards(response_mask=mask_BT, logprob_alt_pos=logprob_alt_pos,
                            logprob_alt_neg=logprob_alt_neg)
  beta = jnp.asarray(beta, jnp.float32)
  len_B = jnp.maximum(jnp.sum(mask_BT, axis=-1), 1).astype(jnp.float32)
  if form == "weighted_logprob":
    loss_B = -beta * ops.masked_sum(r_BT * lp_BT, mask_BT, axis=-1)
    if token_reduce == "mean":
      loss_B = loss_B / len_B
  else:
    if logprob_ref is None:
      raise ValueError('treg_regularizer_loss: form="agreement" needs `logprob_ref`')
    ref_BT = jnp.where(mask_BT, jnp.asarray(logprob_ref, jnp.float32), 0.0)
    chex.assert_equal_shape([mask_BT, ref_BT])
    temp = beta if temperature is None else jnp.asarray(temperature, jnp.float32)
    rho_BT = beta * (lp_BT - jax.lax.stop_gradient(ref_BT))
    term_BT = jnp.where(mask_BT, -jax.nn.log_sigmoid(r_BT * rho_BT / temp), 0.0)
    loss_B = ops.masked_sum(term_BT, mask_BT, axis=-1) / len_B
  if pair_weight is not None:
    w_B = jax.lax.stop_gradient(jnp.asarray(pair_weight, jnp.float32))
    chex.assert_equal_shape_prefix([w_B, mask_BT], 1)
    loss_B = w_B * loss_B
  return loss_B


@register_estimator(
    "treg", needs=("reward", "group_id", "response_mask", "logprob_alt_pos", "logprob_alt_neg"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "mode", "renormalize",
                                   "group_std"))
def treg_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_alt_pos: ArrayLike, logprob_alt_neg: ArrayLike, num_groups: int,
                    group_size: int | None = None, alpha: ArrayLike = 0.5,
                    mode: Literal["additive", "redistribute"] = "additive",
                    renormalize: bool = True,
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """T-REG for RL: the GRPO advantage plus the self-generated token rewards.

  Paper: "T-REG: Preference Optimization with Token-Level Reward Regularization" (Zhou,
  Zhang, Zhao, Meng), ACL 2025, arXiv 2412.02685. T-REG is a regulariser for DPO/SimPO,
  not an RL method; this is an RL adapter of it. Spec:
  `shared/methods/token_and_implicit.md` §13.

  Confidence: paper-equation for the token rewards (see `treg_token_rewards`; source:
  the paper's §Method equations, read from a full-paper digest, papernotes ACL 2025
  T-REG; the code repository wzhouad/T-REG was not retrievable); the adapter is ours.

  .. math::
    r̂_{b,t} = σ(ℓ⁺_{b,t} − ℓ⁻_{b,t}) − ½                          ∈ (−½, ½)
    "additive" (default):  A_{b,t} = Â_b + α r̂_{b,t}
    "redistribute" (ours): w = 1 + α sign(Â_b) r̂_{b,t},  w ← L_b w / Σ_t w,  A = Â_b w

  What the adapter does relative to the paper: in DPO, T-REG adds
  −α w Σ_t β r̂_t log π_θ(y_t) to the pair loss (`treg_regularizer_loss`) — a token
  policy-gradient term whose advantage is (α w β) r̂_t, added to DPO's own sequence-level
  gradient. "additive" is exactly that structure in RL: the sequence advantage Â_b (GRPO
  here, in place of DPO's pairwise term) plus a per-token term α r̂_t. What it drops or
  changes: the pair weight w (DPO's per-pair weight; the RL analogue of a per-row weight
  is not defined here), β (folded into α), and the pairing (every sampled response is
  regularised, not a chosen/rejected pair). α = 0.5 is ours (the paper's α ∈ {0.1, 0.25,
  0.5} multiplies β r̂ in a DPO loss, not comparable to a normalised Â). "additive" is not
  zero on all-equal or singleton groups (Â = 0 there, α r̂ is not). "redistribute" (the
  earlier default, ours) only spreads Â over the tokens: the sign is kept (α < 2), with
  `renormalize` Σ_t A = L_b Â_b, and all-equal or singleton groups give exact 0.

  ℓ⁺ / ℓ⁻ (`logprob_alt_pos` / `logprob_alt_neg`) score the sampled tokens under the
  "improve" / "worsen" revision prompts; the paper scores them with the frozen reference
  model (the producer here scores with the behaviour policy — a difference of the runner,
  not of this function). Token rewards carry no gradient. Rows that are empty or outside
  [0, num_groups) give exact zeros. Until 2026-10 r̂ was 2σ(Δ) − 1 (twice the paper's) and
  the default mode was "redistribute".

  Reductions: α = 0, or prompts that agree (ℓ⁺ = ℓ⁻ ⇒ r̂ = 0), give GRPO.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group of each row in [0, num_groups); unused (may be None) when
      `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    logprob_alt_pos: [B,T] float sampled-token log-prob under the "improve" prompt.
    logprob_alt_neg: [B,T] float the same under the "worsen" prompt.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    alpha: α, strength of the token rewards (0.5, ours).
    mode: static, "additive" (default) | "redistribute" (ours).
    renormalize: static, keep the budget Σ_t w = L_b ("redistribute" only).
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  >>> import numpy as np
  >>> r = treg_token_rewards(response_mask=np.ones((1, 3), bool),
  ...                        logprob_alt_pos=np.array([[-0.5, -1.0, -0.2]], np.float32),
  ...                        logprob_alt_neg=np.array([[-1.5, -0.8, -0.2]], np.float32))
  >>> np.round(np.asarray(r, np.float64), 4).tolist()
  [[0.2311, -0.0498, 0.0]]
  """
  check_choice("treg_advantages", "mode", mode, _MODES)
  check_choice("treg_advantages", "group_std", group_std, GROUP_STDS)
  rows = ops.group_rows("treg_advantages", reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  mask_BT = rows.mask & rows.valid[:, None]
  r_BT = treg_token_rewards(response_mask=mask_BT, logprob_alt_pos=logprob_alt_pos,
                            logprob_alt_neg=logprob_alt_neg)
  alpha = jnp.asarray(alpha, jnp.float32)
  if mode == "additive":
    return jnp.where(mask_BT, adv_B[:, None] + alpha * r_BT, 0.0)
  w_BT = signed_weights(adv_B, r_BT, mask_BT, alpha=alpha)
  return redistribute(adv_B, jax.lax.stop_gradient(w_BT), mask_BT, renormalize=renormalize)
