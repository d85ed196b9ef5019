"""RL Tango: generator advantage mixing outcome GRPO with verifier step judgments (scheduled α),
plus the verifier's class-balance loss weights (`class_balance_weights`)."""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["rl_tango_alpha", "rl_tango_advantages", "ClassBalanceState",
           "class_balance_init", "class_balance_weights"]

_PAPER = ("RL Tango: Reinforcing Generator and Verifier Together for Language Reasoning, "
          "arXiv 2505.15034")
_SCHEDULES = ("exp", "fixed")
_BALANCE = ("sqrt_inverse", "inverse")


def rl_tango_alpha(train_step: ArrayLike, *, alpha0: ArrayLike = 0.5,
                   alpha_min: ArrayLike = 1e-3, total_steps: ArrayLike = 1000.0,
                   decay_frac: ArrayLike = 1.0) -> Array:
  """α(step) = max(α_min, α0 · exp(−k · step)),  k = ln(α0/α_min) / (decay_frac · total_steps).

  Reaches α_min after decay_frac·total_steps steps. `train_step` may be traced.
  """
  a0 = jnp.asarray(alpha0, jnp.float32)
  amin = jnp.asarray(alpha_min, jnp.float32)
  k = jnp.log(a0 / amin) / (jnp.asarray(decay_frac, jnp.float32)
                            * jnp.asarray(total_steps, jnp.float32))
  return jnp.maximum(amin, a0 * jnp.exp(-k * jnp.asarray(train_step, jnp.float32)))


@register_estimator("rl_tango", needs=("reward", "step_reward", "step_mask", "step_id",
                                       "group_id", "response_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "schedule", "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: kaiwenzha/RL-Tango "
                            "verl/trainer/ppo/rl_tango_trainer.py, verl/trainer/ppo/core_algos.py"))
def rl_tango_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                        step_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                        num_groups: int, group_size: int | None = None,
                        schedule: Literal["exp", "fixed"] = "exp",
                        train_step: ArrayLike = 0.0, alpha0: ArrayLike = 0.5,
                        alpha_min: ArrayLike = 1e-3, total_steps: ArrayLike = 1000.0,
                        decay_frac: ArrayLike = 1.0, outcome_weight: ArrayLike = 1.0,
                        process_weight: ArrayLike = 1.0, eps: float = 1e-6,
                        singleton: Literal["zero", "raw"] = "zero") -> Array:
  """RL Tango generator advantage: (1 − α)·outcome GRPO + α·returns of z-scored step verdicts.

  A generative verifier, trained with the policy, judges each step of a response; its
  verdicts v (`step_reward`, placed at the last token of each step) become a process
  advantage mixed with the outcome's::

    A_out[i,t]  = (R_i − μ_g) / (σ_g + ε)                     (constant on the response)
    ẑ_{i,s}     = (v_{i,s} − μ'_g) / (σ'_g + ε)                (all valid steps of group g)
    A_proc[i,t] = Σ_{s: end(s) ≥ t} ẑ_{i,s}
    A = (1 − α) A_out + α A_proc,   α = rl_tango_alpha(train_step)      ("exp")
    A = w_o A_out + w_p A_proc                                          ("fixed")

  σ and σ' are unbiased; a group with at most one step uses μ' = 0, σ' = 1.

  Paper: "RL Tango: Reinforcing Generator and Verifier Together for Language Reasoning",
  arXiv 2505.15034. The authors' code averages A_proc over several verifier rollouts per
  sample; here `step_reward` holds one verifier's verdicts (average the rollouts' A_proc
  outside for the code's form). Steps without tokens are ignored.

  Args:
    reward: [B] outcome.
    step_reward: [B,K] verifier verdicts v (±1/S in the code).
    step_mask: [B,K] bool.
    step_id: [B,T] int step of each token (−1 outside).
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    schedule: static, "exp" | "fixed".
    train_step: the training step (may be traced).
    alpha0: α0 of the schedule.
    alpha_min: α_min of the schedule.
    total_steps: the run's length (for the schedule).
    decay_frac: fraction of the run over which α decays to α_min.
    outcome_weight: w_o of "fixed".
    process_weight: w_p of "fixed".
    eps: added to σ and σ'.
    singleton: static "zero" | "raw", for the outcome part.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = rl_tango_advantages(
    ...     reward=np.array([1., 0.]), step_reward=np.array([[.5, .5], [.5, -.5]]),
    ...     step_mask=np.ones((2, 2), bool), step_id=np.array([[0, 0, 1, 1]] * 2, np.int32),
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool),
    ...     num_groups=1, schedule="fixed")
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.7071, 1.7071, 1.2071, 1.2071], [-1.7071, -1.7071, -2.2071, -2.2071]]
  """
  fn = "rl_tango_advantages"
  check_choice(fn, "schedule", schedule, _SCHEDULES)
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  r_B, gid_B, m_BT, valid_B = ops.group_rows(fn, reward, group_id, num_groups, group_size,
                                             response_mask=response_mask)
  v_BK = jnp.asarray(step_reward, jnp.float32)
  sid = jnp.asarray(step_id)
  chex.assert_rank([v_BK, sid], 2)
  chex.assert_type(sid, int)
  chex.assert_equal_shape([sid, m_BT])
  chex.assert_equal_shape_prefix([v_BK, r_B], 1)
  sid = sid.astype(jnp.int32)
  K = v_BK.shape[1]
  out_B = ops.group_normalize(r_B, gid_B, num_groups, valid=valid_B, eps=eps,
                              singleton=singleton, group_size=group_size)
  a_out = ops.broadcast_to_tokens(jnp.where(valid_B, out_B, 0.0), m_BT)

  has_tok = ops.turn_reduce(jnp.zeros(m_BT.shape), sid, K, m_BT, reduce="count") > 0
  ok_BK = jnp.asarray(step_mask).astype(bool) & has_tok & valid_B[:, None]
  chex.assert_equal_shape([ok_BK, v_BK])
  z_BK = ops.turn_normalize(v_BK, ok_BK, gid_B, num_groups, by="pooled", ddof=1, eps=eps,
                            min_count=2, small="raw")
  ends = ops.turn_edges(sid, m_BT, K, last=True)
  x_BT = jnp.where(ends, ops.turn_broadcast(z_BK, sid, m_BT), 0.0)
  a_proc = ops.discounted_reverse_cumsum(x_BT, m_BT & valid_B[:, None], 1.0)

  if schedule == "exp":
    alpha = rl_tango_alpha(train_step, alpha0=alpha0, alpha_min=alpha_min,
                           total_steps=total_steps, decay_frac=decay_frac)
    adv = (1.0 - alpha) * a_out + alpha * a_proc
  else:
    adv = (jnp.asarray(outcome_weight, jnp.float32) * a_out
           + jnp.asarray(process_weight, jnp.float32) * a_proc)
  return jnp.where(m_BT & valid_B[:, None], adv, 0.0)


class ClassBalanceState(NamedTuple):
  """EMA of the positive / negative example counts of the verifier's labels.

  pos, neg: float32 scalars; seen: bool scalar, False until the first batch.
  """
  pos: Array
  neg: Array
  seen: Array


def class_balance_init() -> ClassBalanceState:
  """An empty state: the first batch initialises the EMAs."""
  return ClassBalanceState(pos=jnp.zeros((), jnp.float32), neg=jnp.zeros((), jnp.float32),
                           seen=jnp.zeros((), bool))


def class_balance_weights(labels: ArrayLike, state: ClassBalanceState, *,
                          decay: ArrayLike = 0.8,
                          mode: Literal["sqrt_inverse", "inverse"] = "sqrt_inverse",
                          valid: ArrayLike | None = None
                          ) -> tuple[Array, ClassBalanceState]:
  """RL Tango's class-imbalance weights for the verifier's per-sample loss.

  ::

    n⁺ ← d n⁺ + (1 − d) #pos,   n⁻ ← d n⁻ + (1 − d) #neg          (first batch: n = #)
    c_i = n_{y_i}^(−1/2) ("sqrt_inverse") or n_{y_i}^(−1) ("inverse")
    w_i = c_i / mean over the valid rows of c

  as the authors' trainer (kaiwenzha/RL-Tango `rl_tango_trainer.py`) weighs the verifier's
  samples. The weights multiply each sample's loss (`sample_weight` of the policy losses).
  A class never seen has no sample in the batch, so its coefficient is never used.

  Args:
    labels: [B] bool, True for a positive example (the verifier's target).
    state: `ClassBalanceState` (`class_balance_init()`).
    decay: EMA decay d.
    mode: static, "sqrt_inverse" | "inverse".
    valid: optional [B] bool rows that count (others get weight 0).

  Returns:
    (sample_weight [B] float32 with mean 1 over the valid rows, new state). For example,
    3 positives and 1 negative in the first batch give [0.845299] × 3 and [1.464102].
  """
  check_choice("class_balance_weights", "mode", mode, _BALANCE)
  y_B = jnp.asarray(labels).astype(bool)
  chex.assert_rank(y_B, 1)
  ok_B = jnp.ones_like(y_B) if valid is None else jnp.asarray(valid).astype(bool)
  chex.assert_equal_shape([y_B, ok_B])
  n_pos = jnp.sum(ok_B & y_B, dtype=jnp.float32)
  n_neg = jnp.sum(ok_B & ~y_B, dtype=jnp.float32)
  d = jnp.asarray(decay, jnp.float32)
  seen = jnp.asarray(state.seen, bool)
  pos = jnp.where(seen, d * state.pos + (1.0 - d) * n_pos, n_pos)
  neg = jnp.where(seen, d * state.neg + (1.0 - d) * n_neg, n_neg)
  count_B = jnp.where(y_B, pos, neg)
  safe = jnp.maximum(count_B, 1e-12)
  c_B = jax.lax.rsqrt(safe) if mode == "sqrt_inverse" else 1.0 / safe
  c_B = jnp.where(ok_B, c_B, 0.0)
  mean_c = ops.masked_mean(c_B, ok_B)
  w_B = jnp.where(ok_B, c_B / jnp.where(mean_c > 0, mean_c, 1.0), 0.0)
  new_state = ClassBalanceState(pos=pos, neg=neg, seen=seen | jnp.any(ok_B))
  return w_B, new_state
