"""OREAL: RLOO advantages on binary outcomes, weighted per token by a token-level reward model.

Also holds OREAL's one-correct-one-incorrect trajectory filter (`oreal_pair_filter`). The
loss (positive NLL + negative policy gradient + k3 KL) is `credit.losses.oreal_loss`; the
token reward model's BCE objective is `credit.losses.oreal_token_rm_loss`.
"""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import apply_singleton
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["oreal_token_weights", "oreal_advantages", "oreal_pair_filter"]

_PAPER = ("Exploring the Limit of Outcome Reward for Learning Mathematical Reasoning (OREAL), "
          "arXiv 2502.06781")
_MODES = ("rloo", "grpo")


def oreal_token_weights(token_rm_logit: ArrayLike, response_mask: ArrayLike, *,
                        tau_pos: ArrayLike = 0.5,
                        tau_neg: ArrayLike = 0.5) -> tuple[Array, Array]:
  """OREAL's token importance weights (w⁺, w⁻) from token reward-model logits.

  .. math::
    c_t  = σ( Σ_{t' ≤ t} M_{t'} z_{t'} / Σ_{t' ≤ t} M_{t'} )     (running mean over the response)
    w⁺_t = clip((c_t − τ⁺)/(1 − τ⁺), 0, 1)
    w⁻_t = clip(((1 − c_t) − τ⁻)/(1 − τ⁻), 0, 1)

  Args:
    token_rm_logit: [B,T] logits z of the token reward model (ignored outside the mask).
    response_mask: [B,T] bool.
    tau_pos, tau_neg: thresholds τ⁺, τ⁻ in [0, 1) (code default 0.5).

  Returns:
    (w_pos [B,T], w_neg [B,T]) float32, zero outside `response_mask`.
  """
  m_BT = jnp.asarray(response_mask).astype(bool)
  z_BT = jnp.asarray(token_rm_logit, jnp.float32)
  chex.assert_rank([z_BT, m_BT], 2)
  chex.assert_equal_shape([z_BT, m_BT])
  z_BT = jnp.where(m_BT, z_BT, 0.0)
  num = jnp.cumsum(z_BT, axis=-1)
  den = jnp.cumsum(m_BT.astype(jnp.float32), axis=-1)
  c_BT = jax.nn.sigmoid(num / jnp.maximum(den, 1.0))
  tp = jnp.asarray(tau_pos, jnp.float32)
  tn = jnp.asarray(tau_neg, jnp.float32)
  w_pos = jnp.clip((c_BT - tp) / (1.0 - tp), 0.0, 1.0)
  w_neg = jnp.clip(((1.0 - c_BT) - tn) / (1.0 - tn), 0.0, 1.0)
  return jnp.where(m_BT, w_pos, 0.0), jnp.where(m_BT, w_neg, 0.0)


@register_estimator("oreal", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    optional_needs={"token_rm_logit": "use_token_rm"},
                    static_argnames=("num_groups", "group_size", "mode", "singleton",
                                     "use_token_rm"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: InternLM/OREAL train_oreal.py (reward shaping, "
                            "threshold_rescale, the loss block), oreal/datasets/trajectory.py"))
def oreal_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                     num_groups: int, group_size: int | None = None,
                     token_rm_logit: ArrayLike | None = None, use_token_rm: bool = False,
                     mode: Literal["rloo", "grpo"] = "rloo", tau_pos: ArrayLike = 0.5,
                     tau_neg: ArrayLike = 0.5, eps: float = 1e-8,
                     singleton: Literal["zero", "raw"] = "zero") -> Array:
  """OREAL advantages: RLOO (or GRPO) on the outcome, times the token reward model's weights.

  ::

    a_i = R_i − (S_g − R_i)/(n_g − 1)              ("rloo", the default)
    a_i = (R_i − μ_g)/(σ_g + ε)                      ("grpo")
    A[i,t] = a_i · w⁺_t  if R_i > 0,   a_i · w⁻_t  otherwise

  with w⁺, w⁻ from `oreal_token_weights` (τ⁺ = τ⁻ = 0.5), or w = 1 without
  `token_rm_logit`. The loss `credit.losses.oreal_loss` splits rows by the sign of the
  reward, so the weights travel inside the advantages (the code's `pos_mult_adv=True`).
  Rewards in {+1, −1} (the code's judge) or {1, 0} give the same advantages.

  Paper: "Exploring the Limit of Outcome Reward for Learning Mathematical Reasoning",
  arXiv 2502.06781. As the authors' `train_oreal.py`.

  Args:
    reward: [B] outcome (+1 correct, −1 or 0 wrong).
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    token_rm_logit: optional [B,T] token reward-model logits z.
    use_token_rm: static; makes the registry ask for `token_rm_logit` (the weights are
      applied whenever it is given).
    mode: static, "rloo" | "grpo".
    tau_pos: τ⁺ of the token weights.
    tau_neg: τ⁻ of the token weights.
    eps: added to σ in "grpo" mode.
    singleton: "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = oreal_advantages(reward=np.array([1., -1., -1., -1.]), group_id=np.zeros(4, np.int32),
    ...                      response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [2.0, -0.6667, -0.6667, -0.6667]
  """
  fn = "oreal_advantages"
  check_choice(fn, "mode", mode, _MODES)
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  if use_token_rm and token_rm_logit is None:
    raise ValueError(f"{fn}: use_token_rm=True needs token_rm_logit [B,T]")
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      fn, reward, group_id, num_groups, group_size, response_mask=response_mask)
  if mode == "rloo":
    cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                                singleton="zero", group_size=group_size)
    n_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
    adv_B = apply_singleton(cen_B * n_B / jnp.maximum(n_B - 1.0, 1.0), reward_B, n_B,
                            singleton)
  else:
    adv_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=True,
                                eps=eps, singleton=singleton, group_size=group_size)
  adv_BT = ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
  if token_rm_logit is None:
    return adv_BT
  w_pos, w_neg = oreal_token_weights(token_rm_logit, mask_BT, tau_pos=tau_pos,
                                     tau_neg=tau_neg)
  w_BT = jnp.where((reward_B > 0)[:, None], w_pos, w_neg)
  return adv_BT * jax.lax.stop_gradient(w_BT)


def oreal_pair_filter(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                      key: jax.Array, num_groups: int,
                      group_size: int | None = None) -> Array:
  """OREAL's trajectory filter: per prompt, one random correct and one random incorrect row.

  Only prompts with a pass rate strictly between 0 and 1 are kept, and of them one correct
  (R > 0) and one incorrect (R ≤ 0) sample, chosen uniformly at random, as the authors'
  `oreal/datasets/trajectory.py` does. OREAL shapes the rewards on the full group and
  filters afterwards, so compute `oreal_advantages` on the unfiltered batch, then drop the
  rows this mask rejects (`response_mask & keep[:, None]`). Filtering first changes the
  baseline: with rewards (+1, −1, −1, −1) the kept incorrect row's RLOO advantage is −2/3
  in the code's order and −2 when the pair alone forms the group.

  Args:
    reward: [B] outcome; correct means R > 0.
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool (empty rows are never kept).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    key: PRNG key of the random choice.

  Returns:
    [B] bool keep mask (exactly 0 or 2 rows per group), to apply after the advantages.
  """
  fn = "oreal_pair_filter"
  reward_B, gid_B, _, valid_B = ops.group_rows(fn, reward, group_id, num_groups, group_size,
                                               response_mask=response_mask)
  pos_B = valid_B & (reward_B > 0)
  neg_B = valid_B & (reward_B <= 0)
  # Segment of (group, correctness); the winner of each segment is its smallest random draw
  # (ties, of probability ~0, broken by the row index).
  seg_B = jnp.where(pos_B, 2 * gid_B, 2 * gid_B + 1)
  seg_B = jnp.where(valid_B, seg_B, 2 * num_groups)
  ns = 2 * num_groups + 1
  u_B = jax.random.uniform(key, reward_B.shape)
  u_min = jax.ops.segment_min(u_B, seg_B, ns)[seg_B]
  idx_B = jnp.arange(reward_B.shape[0], dtype=jnp.int32)
  first = jax.ops.segment_min(jnp.where(u_B == u_min, idx_B, reward_B.shape[0]), seg_B, ns)
  chosen_B = valid_B & (idx_B == first[seg_B])
  n_pos = ops.group_reduce_rows(pos_B.astype(jnp.float32), gid_B, valid_B, num_groups,
                                group_size, "sum")
  n_neg = ops.group_reduce_rows(neg_B.astype(jnp.float32), gid_B, valid_B, num_groups,
                                group_size, "sum")
  return chosen_B & (n_pos > 0) & (n_neg > 0)
