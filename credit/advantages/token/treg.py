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

  T-REG scores each token under two contrastive revision prompts ("improve" ℓ⁺ and
  "worsen" ℓ⁻); with `scale=1` this is the paper's r̂_t = σ(ℓ⁺ − ℓ⁻) − 0.5.

  Args:
    response_mask: [B,T] bool.
    logprob_alt_pos: [B,T] float log-prob of the token under the "improve" prompt.
    logprob_alt_neg: [B,T] float log-prob of the token under the "worsen" prompt.
    scale: multiplier of σ(Δ) − ½.

  Returns:
    [B,T] float32 token rewards (no gradient), 0 outside the mask.

  Example:
    >>> import numpy as np
    >>> r = treg_token_rewards(response_mask=np.ones((1, 3), bool),
    ...                        logprob_alt_pos=np.array([[-0.5, -1.0, -0.2]], np.float32),
    ...                        logprob_alt_neg=np.array([[-1.5, -0.8, -0.2]], np.float32))
    >>> np.round(np.asarray(r, np.float64), 4).tolist()
    [[0.2311, -0.0498, 0.0]]
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

  r_DPO(x, y) = β Σ_t (log π_θ − log π_ref)(y_t) is DPO's implicit reward, so w is DPO's own
  per-pair gradient weight: the regulariser weighs most where DPO still ranks the pair
  wrongly.

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

  `form="weighted_logprob"` (the paper's) is a token-weighted log-likelihood::

    L_REG(x, y) = − Σ_t β · r̂_t · log π_θ(y_t | x, y_<t)
    L = L_DPO + α · w · (L_REG(x, y_w) + L_REG(x, y_l)),   w = `treg_pair_weight`

  with α ∈ {0.1, 0.25, 0.5} in the paper. `form="agreement"` (an alternative of this
  library's) asks DPO's token rewards ρ_t = β (log π_θ − log π_ref) to agree in sign with
  r̂_t: L_b = −(1/L_b) Σ_t log σ(r̂_t ρ_t / β_r). Gradients flow into `logprob` only;
  empty rows give 0.

  Args:
    logprob: [B,T] float policy log-prob of the sampled token (differentiated).
    logprob_alt_pos: [B,T] float reference log-prob under the "improve" prompt.
    logprob_alt_neg: [B,T] float reference log-prob under the "worsen" prompt.
    response_mask: [B,T] bool.
    beta: DPO β.
    pair_weight: optional [B] float sequence weight w (stop-gradient).
    token_reduce: static, "sum" (paper) | "mean" ("weighted_logprob" only).
    form: static, "weighted_logprob" | "agreement".
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
                                   "group_std"),
                    confidence="paper-equation",
                    source=(_PAPER + ", its method section's equations (the RL adapter is this "
                            "library's)"))
def treg_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_alt_pos: ArrayLike, logprob_alt_neg: ArrayLike, num_groups: int,
                    group_size: int | None = None, alpha: ArrayLike = 0.5,
                    mode: Literal["additive", "redistribute"] = "additive",
                    renormalize: bool = True,
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """T-REG for RL: the GRPO advantage plus self-generated token rewards.

  T-REG regularises DPO with token rewards the model gives itself under contrastive
  revision prompts. In DPO its term is a token policy gradient with advantage ∝ r̂_t added
  to the sequence-level one; this adapter keeps that structure with GRPO's Â_b::

    r̂[b,t] = σ(ℓ⁺ − ℓ⁻) − ½                                    ∈ (−½, ½)
    "additive" (default):   A[b,t] = Â_b + α r̂[b,t]
    "redistribute":         w = 1 + α sign(Â_b) r̂,  w ← L_b w / Σ_t w,  A = Â_b w

  α = 0, or prompts that agree (r̂ = 0), give GRPO. "additive" is not zero on all-equal
  groups (α r̂ is not); "redistribute" keeps signs (α < 2) and the response's credit.

  Paper: "T-REG: Preference Optimization with Token-Level Reward Regularization",
  ACL 2025, arXiv 2412.02685. T-REG is a regulariser for DPO / SimPO; the RL adapter is
  this library's: it drops DPO's pair weight, folds β into α (0.5 here), and regularises
  every sampled response rather than a chosen / rejected pair. The paper scores ℓ± with
  the frozen reference; the runner's producer scores them with the behaviour policy.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_alt_pos: [B,T] float sampled-token log-prob under the "improve" prompt.
    logprob_alt_neg: [B,T] float the same under the "worsen" prompt.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    alpha: α, strength of the token rewards.
    mode: static, "additive" | "redistribute".
    renormalize: static, keep the budget Σ_t w = L_b ("redistribute" only).
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> kw = dict(logprob_alt_pos=np.array([[-0.5, -1.0, -0.2]] * 2, np.float32),
    ...           logprob_alt_neg=np.array([[-1.5, -0.8, -0.2]] * 2, np.float32))
    >>> a = treg_advantages(reward=np.array([1., 0.]), group_id=np.zeros(2, np.int32),
    ...                     response_mask=np.ones((2, 3), bool), num_groups=1,
    ...                     group_std="population", **kw)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.1155, 0.9751, 1.0], [-0.8845, -1.0249, -1.0]]
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
