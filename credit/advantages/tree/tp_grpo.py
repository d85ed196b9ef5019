"""TP-GRPO: incremental step rewards, turning points credited with the long-term reward."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops._cast import as_f32
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["tp_grpo_advantages", "tp_grpo_step_rewards"]

_PAPER = ("Alleviating Sparse Rewards by Modeling Step-Wise and Long-Term Sampling Effects in "
          "Flow-Based GRPO (TurningPoint-GRPO), arXiv preprint; code "
          "https://github.com/YunzeTong/TurningPoint-GRPO")

MODES = ("increment_main", "global_main")


def _top_by_magnitude(sel_M: Array, mag_M: Array, keep: Array) -> Array:
  """[M] bool: the `keep` entries of `sel` with the largest `mag`, ties by ascending index.

  rank_i = #{j selected : mag_j > mag_i or (mag_j = mag_i, j < i)}, the position of i in a
  stable sort of the selected entries by descending magnitude (O(M log M), M = B·K; the
  others sort after them).
  """
  M = sel_M.shape[0]
  order_M = jnp.argsort(jnp.where(sel_M, -mag_M, jnp.inf), stable=True)
  rank_M = jnp.zeros(M, jnp.int32).at[order_M].set(jnp.arange(M, dtype=jnp.int32))
  return sel_M & (rank_M < keep)


def tp_grpo_step_rewards(*, reward: ArrayLike, step_value: ArrayLike, start_value: ArrayLike,
                         valid_BK: ArrayLike,
                         mode: Literal["increment_main", "global_main"] = "increment_main",
                         eta: ArrayLike = 1.0, first_step_bonus: bool = True,
                         consistency: bool = True, balance: bool = True,
                         drop_original: bool = True,
                         propagate_bonus_to_future_steps: bool = False) -> tuple[Array, Array]:
  """(ρ [B,K], turning [B,K] bool): TP-GRPO's step rewards and the turning points that got the
  bonus (after balancing); see `tp_grpo_advantages`. Zero / False outside `valid_BK`."""
  check_choice("tp_grpo_step_rewards", "mode", mode, MODES)
  valid = jnp.asarray(valid_BK, bool)
  v = as_f32(step_value)
  v0 = as_f32(start_value)
  r = as_f32(reward)
  chex.assert_rank([v, valid, v0, r], [2, 2, 1, 1])
  chex.assert_equal_shape([v, valid])
  row = jnp.any(valid, axis=1)
  v = jnp.where(valid, v, 0.0)
  v0 = jnp.where(row, v0, 0.0)
  r = jnp.where(row, r, 0.0)
  v_prev = ops.previous_valid(v, valid, v0)
  d = jnp.where(valid, v - v_prev, 0.0)                       # d_k = V_k − V_{k−1}
  delta = r - v0                                               # Δ = R − V_0
  s = jnp.sign(d) * jnp.sign(delta)[:, None]
  cons = jnp.sign(d) * jnp.sign(r[:, None] - v) > 0            # the rest agrees with the step
  s_prev = ops.previous_valid(s, valid, jnp.zeros_like(v0))
  first = valid & (ops.previous_valid(valid.astype(jnp.float32), valid, jnp.zeros_like(v0)) == 0)
  if first_step_bonus:
    tp_first = first & (cons if consistency else s > 0)
  else:
    tp_first = jnp.zeros_like(valid)
  tp_later = valid & ~first & (s_prev < 0) & (s > 0)
  if consistency:
    tp_later = tp_later & cons
  turning = tp_first | tp_later
  cand = jnp.broadcast_to(delta[:, None], d.shape) if mode == "increment_main" else d
  if balance:
    pos, neg = turning & (cand > 0), turning & (cand < 0)
    n_pos, n_neg = jnp.sum(pos), jnp.sum(neg)
    keep = jnp.minimum(n_pos, n_neg)
    mag = jnp.abs(cand).reshape(-1)
    kept = (_top_by_magnitude(pos.reshape(-1), mag, keep)
            | _top_by_magnitude(neg.reshape(-1), mag, keep)).reshape(d.shape)
    turning = jnp.where((n_pos > 0) & (n_neg > 0), kept, turning)
  eta = jnp.asarray(eta, jnp.float32)
  if mode == "increment_main":
    main, bonus = d, eta * (r[:, None] - v_prev)               # L_k = R − V_{k−1}
  else:
    main, bonus = jnp.broadcast_to(delta[:, None], d.shape), eta * d
  b = jnp.where(turning, bonus, 0.0)
  if propagate_bonus_to_future_steps:
    # The code's propagation: with L_k = R − V_{k−1} and c⁺_k (c⁻_k) the number of turning
    # points with L > 0 at or before k (with L < 0 at or after k), b_k = η (c⁺_k + c⁻_k) L_k.
    lk = jnp.where(valid, r[:, None] - v_prev, 0.0)
    c_pos = jnp.cumsum((turning & (lk > 0)).astype(jnp.float32), axis=1)
    c_neg = jnp.cumsum((turning & (lk < 0)).astype(jnp.float32)[:, ::-1], axis=1)[:, ::-1]
    b = jnp.where(valid, eta * (c_pos + c_neg) * lk, 0.0)
  rho = jnp.where(drop_original & (b != 0), b, main + b)
  return jnp.where(valid, rho, 0.0), turning


@register_estimator(
    "tp_grpo", needs=("reward", "step_value", "start_value", "step_mask", "step_id", "group_id",
                      "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "mode", "first_step_bonus", "consistency",
                                   "balance", "drop_original", "propagate_bonus_to_future_steps"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: YunzeTong/TurningPoint-GRPO "
                            "scripts/my_train_flux_fast_with_op3.py (process reward "
                            "computation), scripts/single_node/common_op3.sh, config/my_grpo.py, "
                            "flow_grpo/stat_tracking.py"))
def tp_grpo_advantages(*, reward: ArrayLike, step_value: ArrayLike, start_value: ArrayLike,
                       step_mask: ArrayLike, step_id: ArrayLike, group_id: ArrayLike,
                       response_mask: ArrayLike, num_groups: int, eta: ArrayLike = 1.0,
                       mode: Literal["increment_main", "global_main"] = "increment_main",
                       first_step_bonus: bool = True, consistency: bool = True,
                       balance: bool = True, drop_original: bool = True,
                       propagate_bonus_to_future_steps: bool = False,
                       eps: float = 1e-4) -> Array:
  """TP-GRPO: per-step increments; turning points get the long-term reward; z-scored per (prompt, step).

  With V_0 = `start_value`, V_k = `step_value[:, k−1]` (the verifier's score of a
  completion from each step boundary) and R the rollout's reward::

    d_k = V_k − V_{k−1},   Δ = R − V_0,   s_k = sign(d_k) sign(Δ)
    turning:  k = 1: sign(d_1) sign(R − V_1) > 0;   k > 1: s_{k−1} < 0, s_k > 0 and consistent
    increment_main:  ρ_k = η (R − V_{k−1}) at turning points, d_k elsewhere
    global_main:     ρ_k = η d_k at turning points, Δ elsewhere
    A[b,k] = (ρ[b,k] − mean) / (std_pop + 1e-4)    over the rows of b's prompt group at step k

  A turning point is the step where a trajectory turns towards its final outcome, so it
  carries the long-term reward. Bonuses are balanced batch-wide between positive and
  negative keys; `propagate_bonus_to_future_steps` spreads them over later (or earlier)
  steps. Defaults are the authors' run script's.

  Paper: "Alleviating Sparse Rewards by Modeling Step-Wise and Long-Term Sampling Effects in
  Flow-Based GRPO" (TP-GRPO). The code is for flow-matching image models; reading V as a
  verifier's score of a text completion is this library's adaptation. Balancing spans the
  whole batch (the code: one process's batch); missing steps are skipped.

  Args:
    reward: [B] float R, the rollout's final reward.
    step_value: [B,K] float V_1..V_K, the value after each step.
    start_value: [B] float V_0, the value before the first step.
    step_mask: [B,K] bool, the steps that exist.
    step_id: [B,T] int step of each token, −1 outside.
    group_id: [B] int prompt group in [0, num_groups).
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of prompt groups.
    eta: η, the bonus coefficient.
    mode: static, "increment_main" | "global_main".
    first_step_bonus: static switch.
    consistency: static switch.
    balance: static switch.
    drop_original: static switch.
    propagate_bonus_to_future_steps: static switch.
    eps: added to the std.

  Returns:
    [B,T] float32 advantages (no gradient), zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> rho, tp = tp_grpo_step_rewards(reward=np.array([0.7]), step_value=np.array([[.4, .6, .7]]),
    ...     start_value=np.array([0.5]), valid_BK=np.ones((1, 3), bool))
    >>> np.round(np.asarray(rho, np.float64), 6).tolist(), np.asarray(tp).tolist()
    ([[-0.1, 0.3, 0.1]], [[False, True, False]])
  """
  check_choice("tp_grpo_advantages", "mode", mode, MODES)
  rows = ops.group_rows("tp_grpo_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  sid = jnp.asarray(step_id, jnp.int32)
  step = jnp.asarray(step_mask).astype(bool)
  chex.assert_rank([sid, step], 2)
  chex.assert_equal_shape([sid, rows.mask])
  chex.assert_equal_shape_prefix([step, rows.mask], 1)
  valid = step & rows.valid[:, None]
  rho, _ = tp_grpo_step_rewards(reward=rows.values, step_value=step_value,
                                start_value=start_value, valid_BK=valid, mode=mode, eta=eta,
                                first_step_bonus=first_step_bonus, consistency=consistency,
                                balance=balance, drop_original=drop_original,
                                propagate_bonus_to_future_steps=propagate_bonus_to_future_steps)
  adv = ops.turn_normalize(rho, valid, rows.group_id, num_groups, by="index", ddof=0, eps=eps)
  return jax.lax.stop_gradient(ops.turn_broadcast(adv, sid, rows.mask))
