"""PRIME: implicit process rewards of an online PRM combined with the RLOO outcome return."""
from __future__ import annotations

from typing import Literal

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

  Confidence: code-verified (PRIME-RL/PRIME `dp_prime.compute_implicit_reward` and its
  `batch_norm` branch). With q_t = log π_φ(y_t) − log π_ref(y_t) on valid tokens:

  .. math::
    s_t = q_t  ("token")   or   s_t = [t = last] · Σ_u q_u  ("whole")
    "max_return":  s_t ← s_t / (max_{b,t} |Σ_{u≥t} s_{b,u}| + 1e-6)   (whole batch)
    "beta":        s_t ← β s_t                                            (paper)

  Args:
    response_mask: [B,T] bool.
    logprob_prm: [B,T] float implicit PRM log-prob of the sampled token.
    logprob_ref: [B,T] float reference log-prob of the same token.
    beta: β of the paper's r = β log π_φ/π_ref (used by `process_scale="beta"` only).
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
  q_BT = jnp.where(mask_BT, prm_BT - ref_BT, 0.0)
  if granularity == "whole":
    q_BT = jnp.where(ops.last_token_mask(mask_BT), jnp.sum(q_BT, -1, keepdims=True), 0.0)
  if process_scale == "beta":
    return jnp.asarray(beta, jnp.float32) * q_BT
  ret_BT = ops.discounted_reverse_cumsum(q_BT, mask_BT)
  denom = jnp.max(jnp.where(mask_BT, jnp.abs(ret_BT), 0.0)) + _MAX_RETURN_EPS
  return q_BT / denom


@register_estimator(
    "prime", needs=("reward", "group_id", "response_mask", "logprob_prm", "logprob_ref"),
    paper=_PAPER,
    static_argnames=("num_groups", "group_size", "granularity", "process_scale",
                     "process_baseline", "whiten"))
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

  Paper: "Process Reinforcement through Implicit Rewards" (Cui et al.), arXiv 2502.01456
  (`shared/methods/token_and_implicit.md` §1 and its "Corrections from the authors' code").
  An implicit PRM π_φ (trained online with `credit.losses.prm_ce_loss`) scores every
  sampled token by q_t = log π_φ(y_t) − log π_ref(y_t); PRIME turns those scores into
  dense rewards and adds the outcome's leave-one-out advantage.

  Confidence: code-verified (PRIME-RL/PRIME `training/verl/workers/actor/dp_prime.py`
  `compute_implicit_reward` and `batch_norm`, `training/verl/trainer/ppo/core_algos.py`
  `compute_rloo_returns`, `training/examples/run_prime_main.sh`). With s_{i,t} the token
  scores of `prime_token_scores`, m_i = mean_t s_{i,t} over the valid tokens of row i,
  K the number of valid rows of its group:

  .. math::
    "group_mean" (code):     s̃_{i,t} = K/(K−1) · s_{i,t} − Σ_{j∈g} m_j /(K−1)
    "leave_one_out" (paper): s̃_{i,t} = s_{i,t} − Σ_{j∈g, j≠i} m_j /(K−1)
    A^o_i = R_i − Σ_{j≠i} R_j /(K−1)                      (outcome RLOO)
    G_{i,t} = Σ_{u≥t} γ_p^{u−t} s̃_{i,u} + γ_o^{L_i−1−t} A^o_i
    A = (G − mean(G)) / sqrt(var(G) + 1e-8)              (all valid tokens of the batch)

  with the mean and the unbiased variance taken over every valid token of the batch.

  Where the paper and the released code disagree (the code is the default; the paper's
  form is an option named after what it does):
    * scale: the code feeds the raw log-ratio q (no β; the `rm_coef`/`reward_coef`
      weights never reach the RLOO return) divided by the batch's largest |reverse
      cumulative sum| + 1e-6 (`process_scale="max_return"`, the `batch_norm` default);
      the paper's r = β q is `process_scale="beta"` (β = `beta_train` = 0.05).
    * baseline: the code's loop subtracts the mean of *all* K per-sample means and scales
      by K/(K−1) (`process_baseline="group_mean"`), which equals the paper's leave-one-out
      baseline plus (s_{i,t} − m_i)/(K−1); the paper is `"leave_one_out"`.
    * The paper configuration is `process_scale="beta", process_baseline="leave_one_out"`
      (the spec's worked example).

  Choices (ours):
    * Groups are given by `group_id` (the code assumes contiguous blocks of `n_samples`);
      K counts the non-empty rows of a group, so masking a row equals removing it.
    * Rows of singleton groups (K = 1, where the code divides by zero) and empty rows get
      exact 0 and take no part in the whitening; with fewer than two valid tokens in the
      batch the whitened output is 0 (the code raises). `whiten=False` returns G.
    * The "max_return" normaliser is taken over every valid token of the batch (singletons
      included, as the code normalises before the RLOO step).
    * `process_coef` (ours, default 1) multiplies s̃: 0 gives the outcome RLOO alone.
    * Discounting skips masked positions (observation tokens): the outcome is discounted
      by the number of valid tokens after t. Both γ default to 1 (the authors' script).
    * β only enters under `process_scale="beta"` (it is the PRM loss's β otherwise).
    * The result is batch-coupled: whitening uses the statistics of the whole batch.

  Measured (credit bench, `pivotal`, 2026-12-06, seed 0, from 0.39 held-out; ~8% of the
  training samples succeed): PRIME collapses to 0.00 by step 90. The PRM there learns from
  labels that are ~92% negative. Its score of the policy's new samples turns positive
  (`prm_accuracy` falls 0.86 -> 0.07 while nearly every label is 0, correct rows score below
  incorrect ones), and the policy follows the process reward. At step 150: PRM lr 1e-4 (the
  runner's default) 0.00, 6e-4 (2x the policy's, PRIME's ratio) 0.00, 1e-5 0.25;
  `process_coef=0` (outcome RLOO only) 0.42; GRPO 0.38. PRIME's own runs filter prompts to
  group accuracy in [0.2, 0.8] (a loop concern, see the spec), so the PRM's labels are
  balanced. With the runner's filter (`--config.group_filter.min_accuracy=0.2
  --config.group_filter.max_accuracy=0.8`; 7-20% of the groups kept, 16-64% of the steps
  left with none) PRIME no longer collapses to 0, but it reaches only 0.12-0.17, below its
  start (two runs).

  Args:
    reward: [B] float outcome rewards (verifier, 0/1 in the paper).
    group_id: [B] int group of each row in [0, num_groups); may be None with `group_size`.
    response_mask: [B,T] bool, the policy's tokens.
    logprob_prm: [B,T] float implicit PRM log-prob of each sampled token.
    logprob_ref: [B,T] float reference log-prob (the PRM's reference; the code can use the
      behaviour policy instead: pass `logprob_old` here for that variant).
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    beta: β of the paper's process reward (`process_scale="beta"`).
    process_coef: weight of the process term (ours; 1 = PRIME).
    gamma_process: γ_rm, discount of the process return.
    gamma_outcome: γ_v, discount of the outcome advantage.
    granularity: static, "token" (a score on every token) | "whole" (the sum on the last).
    process_scale: static, "max_return" (code) | "beta" (paper).
    process_baseline: static, "group_mean" (code) | "leave_one_out" (paper).
    whiten: static; whiten the returns over the batch's valid tokens (PRIME) or not.
    eps: added to the variance of the whitening.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

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
  if not isinstance(whiten, bool):
    raise ValueError(f"{fn}: whiten must be a Python bool (static), got {whiten!r}")
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      fn, reward, group_id, num_groups, group_size, response_mask=response_mask)
  tok_BT = mask_BT & valid_B[:, None]
  s_BT = prime_token_scores(response_mask=tok_BT, logprob_prm=logprob_prm,
                            logprob_ref=logprob_ref, beta=beta, granularity=granularity,
                            process_scale=process_scale)
  count_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  ok_B = valid_B & (count_B > 1)
  km1_B = jnp.maximum(count_B - 1.0, 1.0)
  mean_B = ops.masked_mean(s_BT, tok_BT, axis=-1)
  sum_B = ops.group_reduce_rows(mean_B, gid_B, valid_B, num_groups, group_size, "sum")
  if process_baseline == "group_mean":
    proc_BT = (s_BT * count_B[:, None] - sum_B[:, None]) / km1_B[:, None]
  else:
    proc_BT = s_BT - ((sum_B - mean_B) / km1_B)[:, None]
  proc_BT = jnp.asarray(process_coef, jnp.float32) * proc_BT
  # Outcome RLOO from the accurately centred reward: K/(K−1)·(R − μ_g).
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              group_size=group_size)
  out_B = jnp.where(ok_B, cen_B * count_B / km1_B, 0.0)
  ret_BT = (ops.discounted_reverse_cumsum(proc_BT, tok_BT, gamma_process)
            + ops.discounted_reverse_cumsum(ops.outcome_to_token_rewards(out_B, tok_BT),
                                            tok_BT, gamma_outcome))
  use_BT = tok_BT & ok_B[:, None]
  ret_BT = jnp.where(use_BT, ret_BT, 0.0)
  if not whiten:
    return ret_BT
  return ops.masked_whiten(ret_BT, use_BT, eps=eps)
