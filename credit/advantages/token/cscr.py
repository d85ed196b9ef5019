"""CSCR: counterfactual-sensitivity credit reallocation of the GRPO sequence advantage."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.token._redistribute import normalize_budget, redistribute
from credit.ops.baselines import GROUP_STDS, sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["cscr_advantages", "cscr_weights"]

_PAPER = ("CSCR: counterfactual-sensitivity credit reallocation (re-scoring the response "
          "under 'correct' / 'incorrect' assertions), arXiv preprint")


def cscr_weights(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                 logprob_alt_pos: ArrayLike, logprob_alt_neg: ArrayLike,
                 alpha: ArrayLike = 0.5, eps: ArrayLike = 1e-6) -> Array:
  """CSCR token weights w = L_b · exp(−α ŝ) / Σ_t exp(−α ŝ) (see `cscr_advantages`).

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float sampled-token log-prob under the plain prompt.
    logprob_alt_pos: [B,T] float the same under the "correct" context.
    logprob_alt_neg: [B,T] float the same under the "incorrect" context.
    alpha: α ≥ 0, downweighting strength.
    eps: added to the mean sensitivity.

  Returns:
    [B,T] float32 weights > 0 on valid tokens (no gradient), 0 elsewhere; rows sum to L_b.

  Example:
    >>> import numpy as np
    >>> row = lambda x: np.array([x], np.float32)
    >>> w = cscr_weights(response_mask=np.ones((1, 4), bool),
    ...                  logprob_old=row([-0.1, -2.0, -0.5, -1.0]),
    ...                  logprob_alt_pos=row([-0.1, -0.5, -0.45, -1.0]),
    ...                  logprob_alt_neg=row([-0.2, -0.8, -0.55, -1.1]))
    >>> np.round(np.asarray(w, np.float64), 4).tolist()
    [[1.2592, 0.2225, 1.2592, 1.2592]]
  """
  mask_BT = jnp.asarray(response_mask)
  arrays = [jnp.asarray(x, jnp.float32) for x in (logprob_old, logprob_alt_pos,
                                                  logprob_alt_neg)]
  chex.assert_rank([mask_BT] + arrays, 2)
  chex.assert_equal_shape([mask_BT] + arrays)
  mask_BT = mask_BT.astype(bool)
  lp_BT, pos_BT, neg_BT = (jnp.where(mask_BT, x, 0.0) for x in arrays)
  s_BT = jnp.abs(pos_BT - lp_BT) + jnp.abs(neg_BT - lp_BT)
  mean_B = ops.masked_mean(s_BT, mask_BT, axis=-1)
  shat_BT = s_BT / (mean_B + jnp.asarray(eps, jnp.float32))[:, None]
  # ŝ ≥ 0 and its row mean is ≤ 1, so some token has exp(−α ŝ) ≥ e^{−α}: Σ w > 0.
  w_BT = jnp.where(mask_BT, jnp.exp(-jnp.asarray(alpha, jnp.float32) * shat_BT), 0.0)
  return jax.lax.stop_gradient(normalize_budget(w_BT, mask_BT))


@register_estimator(
    "cscr", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_alt_pos",
                   "logprob_alt_neg"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "group_std"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def cscr_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_old: ArrayLike, logprob_alt_pos: ArrayLike,
                    logprob_alt_neg: ArrayLike, num_groups: int,
                    group_size: int | None = None, alpha: ArrayLike = 0.5,
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """CSCR: downweight tokens whose log-prob moves under counterfactual "correct/incorrect" contexts.

  The response is re-scored with the prompt asserting that its answer is correct (ℓ⁺) and
  incorrect (ℓ⁻). Tokens whose probability moves a lot are taken as surface-form-sensitive
  rather than decisive, and get less of the GRPO advantage Â_b::

    s[b,t] = abs(ℓ⁺ − ℓ) + abs(ℓ⁻ − ℓ),      ŝ = s / (mean over the row's valid tokens of s + ε)
    w[b,t] = L_b · exp(−α ŝ) / Σ_t exp(−α ŝ),  A[b,t] = Â_b · w[b,t]

  with ℓ = `logprob_old`. w > 0 keeps every sign, Σ_t A = L_b Â_b keeps the response's
  credit, and the weights carry no gradient. α = 0, or contexts that change nothing, give
  GRPO.

  Paper: "CSCR: counterfactual-sensitivity credit reallocation" (arXiv preprint). The
  abstract gives the idea but no equation: the formula above is this library's reading of
  it; the abstract reports that moderate downweighting worked best.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float behaviour-policy log-prob of the sampled token.
    logprob_alt_pos: [B,T] float the same under the "answer is correct" context.
    logprob_alt_neg: [B,T] float the same under the "answer is incorrect" context.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    alpha: α ≥ 0 (0.5; keep α ≤ 1).
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std and to the mean sensitivity.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> row = lambda x: np.tile(np.array([x], np.float32), (2, 1))
    >>> a = cscr_advantages(reward=np.array([1., 0.]), group_id=np.zeros(2, np.int32),
    ...                     response_mask=np.ones((2, 4), bool),
    ...                     logprob_old=row([-0.1, -2.0, -0.5, -1.0]),
    ...                     logprob_alt_pos=row([-0.1, -0.5, -0.45, -1.0]),
    ...                     logprob_alt_neg=row([-0.2, -0.8, -0.55, -1.1]), num_groups=1,
    ...                     group_std="population")
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.2592, 0.2225, 1.2592, 1.2592], [-1.2592, -0.2225, -1.2592, -1.2592]]
  """
  check_choice("cscr_advantages", "group_std", group_std, GROUP_STDS)
  rows = ops.group_rows("cscr_advantages", reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  w_BT = cscr_weights(response_mask=rows.mask, logprob_old=logprob_old,
                      logprob_alt_pos=logprob_alt_pos, logprob_alt_neg=logprob_alt_neg,
                      alpha=alpha, eps=eps)
  return redistribute(adv_B, w_BT, rows.mask, renormalize=False)
