"""PRIME: implicit process rewards of an online PRM combined with the RLOO outcome return."""
from __future__ import annotations

from typing import Callable, Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["prime_advantages", "prime_token_scores"]

_PAPER = ("Process Reinforcement through Implicit Rewards (PRIME) (Cui et al.), "
          "arXiv 2502.01456")
_GRANULARITIES = ("token", "whole")
_SCALES = ("max_return", "beta")
_BASELINES = ("group_mean", "leave_one_out")
_MAX_RETURN_EPS = 1e-6


def prime_token_scores(*, response_mask: ArrayLike, logprob_prm: ArrayLike,
                       logprob_ref: ArrayLike, beta: ArrayLike = 0.05,
                       granularity: Literal["token", "whole"] = "token",
                       process_scale: Literal["max_return", "beta"] = "max_return") -> Array:
  """PRIME's per-token process scores before the leave-one-out baseline.

  With q_t = log π_φ(y_t) − log π_ref(y_t) on valid tokens::

    s_t = q_t  ("token")   or   s_t = [t = last] Σ_u q_u  ("whole")
    "max_return":  s_t ← s_t / (max_{b,t} abs(Σ_{u≥t} s_{b,u}) + 1e-6)    (whole batch)
    "beta":        s_t ← β s_t                                             (paper)

  Args:
    response_mask: [B,T] bool.
    logprob_prm: [B,T] float implicit PRM log-prob of the sampled token.
    logprob_ref: [B,T] float reference log-prob of the same token.
    beta: β of the paper's r = β log π_φ/π_ref (`process_scale="beta"` only).
    granularity: static, "token" | "whole".
    process_scale: static, "max_return" (code default) | "beta" (paper).

  Returns:
    [B,T] float32 scores, exact 0 outside `response_mask`.
  """
  check_choice("prime_token_scores", "granularity", granularity, _GRANULARITIES)
  check_choice("prime_token_scores", "process_scale", process_scale, _SCALES)
  mask_BT = jnp.asarray(response_mask)
  prm_BT = jnp.asarray(logprob_prm, jnp.float32)
  ref_BT = jnp.asarray(logprob_ref, jnp.float32)
  chex.assert_rank([mask_BT, prm_BT, ref_BT], 2)
  chex.assert_equal_shape([mask_BT, prm_BT, ref_BT])
  mask_BT = mask_BT.astype(bool)
  q_BT = _log_ratio(mask_BT, prm_BT, ref_BT, granularity)
  if process_scale == "beta":
    return jnp.asarray(beta, jnp.float32) * q_BT
  ret_BT = ops.discounted_reverse_cumsum(q_BT, mask_BT)
  denom = jnp.max(jnp.where(mask_BT, jnp.abs(ret_BT), 0.0)) + _MAX_RETURN_EPS
  return q_BT / denom


def _log_ratio(mask_BT: Array, prm_BT: Array, ref_BT: Array, granularity: str) -> Array:
  """q_t = log π_φ − log π_ref on valid tokens ("token"), or their sum on the last ("whole")."""
  q_BT = jnp.where(mask_BT, prm_BT - ref_BT, 0.0)
  if granularity == "whole":
    q_BT = jnp.where(ops.last_token_mask(mask_BT), jnp.sum(q_BT, -1, keepdims=True), 0.0)
  return q_BT


def _undiscounted_process_return(tok_BT: Array, logprob_prm: ArrayLike, logprob_ref: ArrayLike,
                                 *, beta: ArrayLike, granularity: str, process_scale: str,
                                 baseline: Callable[[Array], tuple[Array, Array]]) -> Array:
  """Σ_{u≥t} s̃_u for γ_p = 1 from ONE reverse cumulative sum.

  The baselined score is affine in the score per row, s̃_t = a·s_t − c, so its return is
  a·Σ_{u≥t} s_u − c·n_t with n_t the valid tokens from t on. Both sums come from one
  cumulative sum of the complex q + i·[valid] (its real part is the plain cumulative sum of
  q; the imaginary part counts exactly), instead of one cumulative sum for the scale and a
  second over s̃. `baseline(mean_B) -> (a_B, c_B)` gives the row's affine map from its mean
  score. Rounding differs from summing s̃ directly by float32 rounding only.
  """
  prm_BT = jnp.asarray(logprob_prm, jnp.float32)
  ref_BT = jnp.asarray(logprob_ref, jnp.float32)
  chex.assert_rank([prm_BT, ref_BT], 2)
  chex.assert_equal_shape([tok_BT, prm_BT, ref_BT])
  q_BT = _log_ratio(tok_BT, prm_BT, ref_BT, granularity)
  cum_BT = jax.lax.cumsum(jax.lax.complex(q_BT, tok_BT.astype(jnp.float32)), axis=1,
                          reverse=True)
  rq_BT, n_BT = jnp.real(cum_BT), jnp.imag(cum_BT)
  if process_scale == "beta":
    scale = jnp.asarray(beta, jnp.float32)
    rs_BT, total_B = scale * rq_BT, scale * rq_BT[:, 0]
  else:
    denom = jnp.max(jnp.where(tok_BT, jnp.abs(rq_BT), 0.0)) + _MAX_RETURN_EPS
    rs_BT, total_B = rq_BT / denom, rq_BT[:, 0] / denom
  a_B, c_B = baseline(total_B / jnp.maximum(n_BT[:, 0], 1.0))   # the row's mean score
  return a_B[:, None] * rs_BT - c_B[:, None] * n_BT


@register_estimator(
    "prime", needs=("reward", "group_id", "response_mask", "logprob_prm", "logprob_ref"),
    paper=_PAPER,
    static_argnames=("num_groups", "group_size", "granularity", "process_scale",
                     "process_baseline", "whiten"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: PRIME-RL/PRIME "
                            "training/verl/workers/actor/dp_prime.py (compute_implicit_reward, "
                            "batch_norm), training/verl/trainer/ppo/core_algos.py "
                            "(compute_rloo_returns), training/examples/run_prime_main.sh"))
def prime_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                     response_mask: ArrayLike, logprob_prm: ArrayLike, logprob_ref: ArrayLike,
                     num_groups: int, group_size: int | None = None,
                     beta: ArrayLike = 0.05, process_coef: ArrayLike = 1.0,
                     gamma_process: ArrayLike = 1.0, gamma_outcome: ArrayLike = 1.0,
                     granularity: Literal["token", "whole"] = "token",
                     process_scale: Literal["max_return", "beta"] = "max_return",
                     process_baseline: Literal["group_mean", "leave_one_out"] = "group_mean",
                     whiten: bool = True, eps: ArrayLike = 1e-8) -> Array:
  """PRIME: RLOO over implicit process rewards plus the RLOO outcome, batch-whitened.

  An implicit PRM π_φ, trained online (`credit.losses.prm_ce_loss`), scores every sampled
  token by q_t = log π_φ(y_t) − log π_ref(y_t). With s the token scores of
  `prime_token_scores`, m_i their mean over row i's valid tokens and K the valid rows of
  the group::

    "group_mean" (code):     s̃_{i,t} = K/(K−1) s_{i,t} − Σ_{j∈g} m_j / (K−1)
    "leave_one_out" (paper): s̃_{i,t} = s_{i,t} − Σ_{j∈g, j≠i} m_j / (K−1)
    A^o_i = R_i − Σ_{j≠i} R_j / (K−1)                                (outcome RLOO)
    G_{i,t} = Σ_{u≥t} γ_p^{u−t} s̃_{i,u} + γ_o^{L_i−1−t} A^o_i
    A = (G − mean G) / sqrt(var G + 1e-8)          (over every valid token of the batch)

  Paper: "Process Reinforcement through Implicit Rewards", arXiv 2502.01456. The
  defaults follow the authors' code where it differs from the paper: the raw log-ratio
  scaled by the batch's largest return (`process_scale="max_return"`) and the group-mean
  baseline (`process_baseline="group_mean"`); `process_scale="beta",
  process_baseline="leave_one_out"` is the paper's form. Differences from the code: groups
  come from `group_id`, one-row groups and empty rows give exact 0 (the code divides by
  zero), discounting skips masked positions, and `process_coef` weighs the process term.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (may be None with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_prm: [B,T] float implicit PRM log-prob of each sampled token.
    logprob_ref: [B,T] float the PRM's reference log-prob.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    beta: β of the paper's process reward (`process_scale="beta"`).
    process_coef: weight of the process term (1 is PRIME; 0 the outcome RLOO alone).
    gamma_process: γ_p, discount of the process return.
    gamma_outcome: γ_o, discount of the outcome advantage.
    granularity: static, "token" | "whole".
    process_scale: static, "max_return" (code) | "beta" (paper).
    process_baseline: static, "group_mean" (code) | "leave_one_out" (paper).
    whiten: static; whiten the returns over the batch's valid tokens (PRIME) or return G.
    eps: added to the variance of the whitening.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> q = np.array([[0.2, -0.1, 0.3], [0.0, 0.1, 0.0], [-0.2, -0.2, 0.1]], np.float32)
    >>> m = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], bool)
    >>> a = prime_advantages(reward=np.array([1., 0., 1.]), group_id=np.zeros(3, np.int32),
    ...                      response_mask=m, logprob_prm=q, logprob_ref=np.zeros_like(q),
    ...                      num_groups=1, process_scale="beta",
    ...                      process_baseline="leave_one_out")
    >>> np.round(np.asarray(a, np.float64), 3).tolist()
    [[0.572, 0.556, 0.561], [-1.62, -1.619, 0.0], [0.496, 0.517, 0.538]]
  """
  fn = "prime_advantages"
  check_choice(fn, "process_baseline", process_baseline, _BASELINES)
  check_choice(fn, "granularity", granularity, _GRANULARITIES)
  check_choice(fn, "process_scale", process_scale, _SCALES)
  if not isinstance(whiten, bool):
    raise ValueError(f"{fn}: whiten must be a Python bool (static), got {whiten!r}")
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      fn, reward, group_id, num_groups, group_size, response_mask=response_mask)
  tok_BT = mask_BT & valid_B[:, None]
  count_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  ok_B = valid_B & (count_B > 1)
  km1_B = jnp.maximum(count_B - 1.0, 1.0)
  coef = jnp.asarray(process_coef, jnp.float32)

  def baseline(mean_B):  # s̃ = a·s − c per row
    sum_B = ops.group_reduce_rows(mean_B, gid_B, valid_B, num_groups, group_size, "sum")
    if process_baseline == "group_mean":
      return count_B / km1_B, sum_B / km1_B
    return jnp.ones_like(mean_B), (sum_B - mean_B) / km1_B

  if ops.is_one(gamma_process):
    proc_ret_BT = coef * _undiscounted_process_return(
        tok_BT, logprob_prm, logprob_ref, beta=beta, granularity=granularity,
        process_scale=process_scale, baseline=baseline)
  else:
    s_BT = prime_token_scores(response_mask=tok_BT, logprob_prm=logprob_prm,
                              logprob_ref=logprob_ref, beta=beta, granularity=granularity,
                              process_scale=process_scale)
    mean_B = ops.masked_mean(s_BT, tok_BT, axis=-1)
    a_B, c_B = baseline(mean_B)
    proc_ret_BT = ops.discounted_reverse_cumsum(
        coef * (a_B[:, None] * s_BT - c_B[:, None]), tok_BT, gamma_process)
  # Outcome RLOO from the accurately centred reward: K/(K−1)·(R − μ_g).
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              group_size=group_size)
  out_B = jnp.where(ok_B, cen_B * count_B / km1_B, 0.0)
  if ops.is_one(gamma_outcome):  # undiscounted, the last token's outcome reaches every token
    outcome_BT = ops.broadcast_to_tokens(out_B, tok_BT)
  else:
    outcome_BT = ops.discounted_reverse_cumsum(ops.outcome_to_token_rewards(out_B, tok_BT),
                                               tok_BT, gamma_outcome)
  ret_BT = proc_ret_BT + outcome_BT
  use_BT = tok_BT & ok_B[:, None]
  ret_BT = jnp.where(use_BT, ret_BT, 0.0)
  if not whiten:
    return ret_BT
  return ops.masked_whiten(ret_BT, use_BT, eps=eps)

