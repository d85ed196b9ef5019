"""Outcome-level and group-relative advantage estimators.

Every function here turns rollout fields (a scalar outcome `reward [B]` per
response, group ids, masks and, for a few, per-token arrays) into token
advantages `[B,T]` (or a small NamedTuple when it also returns returns/state).
The math follows `shared/methods/outcome_and_clipping.md` §0-5, 7, 8; estimators
not in that spec were checked against their public reference code (named in
each docstring).

Conventions shared by all group estimators:

* `num_groups` (static int) is the number of segments of the general path; with
  `group_size=G` (static) the batch is read as contiguous groups `[N,G]` (fast
  path, `group_id` is then ignored). Both paths give the same numbers.
* A row is *valid* when its `response_mask` selects at least one token (and, on
  the segment path, its group id lies in `[0, num_groups)`). Invalid rows get
  exact zeros and take no part in any group or batch statistic, so masking a row
  out equals slicing it away. (verl never sees empty rows; this is our choice.)
* `singleton="zero"` (default) gives 0 to a group with one valid member;
  `"raw"` reproduces verl (μ=0, σ=1 for singletons: the advantage is the raw
  reward, scaled where the estimator scales).
* Statistics are computed shifted (ops.group_normalize pivots, two-pass batch
  moments) so rewards like [1000, 1000, 1000, 1000.01] keep their differences.
* Masked and degenerate entries are exact zeros, never NaN, also in gradients.

Static hyperparameters (strings, ints that pick code paths) are validated in
Python and raise `ValueError` naming the valid choices.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

_SCALES = ("group", "batch", "none")
_SINGLETONS = ("zero", "raw")

_P_GRPO = "DeepSeekMath: Pushing the Limits of Mathematical Reasoning (GRPO), arXiv 2402.03300"
_P_DRGRPO = ("Understanding R1-Zero-Like Training: A Critical Perspective (Dr.GRPO), "
             "arXiv 2503.20783")
_P_RLOO = ("Back to Basics: Revisiting REINFORCE Style Optimization for RLHF (RLOO), "
           "arXiv 2402.14740")
_P_RPP = ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, "
          "arXiv 2501.03262")
_P_REMAX = ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning "
            "Large Language Models, arXiv 2310.10505")
_P_OPO = "On-Policy RL with Optimal Reward Baseline (OPO), arXiv 2505.23585"
_P_GPG = ("GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning, "
          "arXiv 2504.02546")
_P_PASSK = ("Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large "
            "Reasoning Models, arXiv 2508.10751 (analytic); verl grpo_passk after arXiv 2503.19595")
_P_GDPO = ("GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL "
           "Optimization, arXiv 2601.05242")
_P_GAE = ("High-Dimensional Continuous Control Using Generalized Advantage Estimation, "
          "arXiv 1506.02438")
_P_OTB = "Optimal Token Baseline (OTB) for policy-gradient variance reduction, arXiv 2602.07078"
_P_DAPO = "DAPO: An Open-Source LLM Reinforcement Learning System at Scale, arXiv 2503.14476"
_P_DCPO = "DCPO: Dynamic Clipping Policy Optimization, arXiv 2509.02333"


# --------------------------------------------------------------------------
# Static-argument checks and input plumbing.
# --------------------------------------------------------------------------


def _check_choice(fn: str, arg: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f"{fn}: {arg} must be one of {list(choices)}, got {value!r}")


def _check_int(fn: str, arg: str, value, minimum: int = 1) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{fn}: {arg} must be a Python int >= {minimum} (static under jit), "
                     f"got {value!r}")


def _check_groups(fn: str, batch: int, num_groups, group_size) -> None:
  _check_int(fn, "num_groups", num_groups)
  if group_size is not None:
    _check_int(fn, "group_size", group_size)
    if batch % group_size:
      raise ValueError(f"{fn}: batch size {batch} is not a multiple of group_size={group_size}")


def _outcome_inputs(fn: str, reward, group_id, response_mask, num_groups, group_size):
  """Arrays, shape asserts and the per-row validity mask for a group estimator."""
  reward_B = jnp.asarray(reward, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, mask_BT], [1, 2])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  batch = reward_B.shape[0]
  _check_groups(fn, batch, num_groups, group_size)
  mask_BT = mask_BT.astype(bool)
  valid_B = jnp.any(mask_BT, axis=-1)
  if group_id is None:
    if group_size is None:
      raise ValueError(f"{fn}: group_id is required on the segment path (group_size=None)")
    gid_B = jnp.arange(batch, dtype=jnp.int32) // group_size
  else:
    gid_B = jnp.asarray(group_id)
    chex.assert_rank(gid_B, 1)
    chex.assert_type(gid_B, int)
    chex.assert_equal_shape([gid_B, reward_B])
    gid_B = gid_B.astype(jnp.int32)
    if group_size is None:
      valid_B = valid_B & (gid_B >= 0) & (gid_B < num_groups)
  return reward_B, gid_B, mask_BT, valid_B


def _safe_div(num: Array, den: Array) -> Array:
  """num/den where den != 0, else 0; the unused branch never divides by zero."""
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


# --------------------------------------------------------------------------
# Row-level group reductions (generic; candidates for credit.ops).
# --------------------------------------------------------------------------

_FILL = {"sum": 0.0, "max": -jnp.inf, "min": jnp.inf}


def _group_reduce_rows(x_B: Array, gid_B: Array, valid_B: Array, num_groups: int,
                       group_size: int | None, op: Literal["sum", "max", "min"]) -> Array:
  """For every row, `op` over the valid rows of its group ([B] -> [B]).

  Invalid rows read an unspecified value; callers mask them. Fast path: a
  reshape to [N,G]; general path: a segment reduction with one extra dropped
  bucket for invalid rows.
  """
  xv = jnp.where(valid_B, x_B, _FILL[op])
  if group_size is not None:
    red = getattr(jnp, op)(xv.reshape(-1, group_size), axis=1)
    return jnp.broadcast_to(red[:, None], (red.shape[0], group_size)).reshape(-1)
  seg = jnp.where(valid_B, gid_B, num_groups)
  seg_fn = {"sum": jax.ops.segment_sum, "max": jax.ops.segment_max,
            "min": jax.ops.segment_min}[op]
  red = seg_fn(xv, seg, num_groups + 1)
  return red[seg]


def _group_count_rows(gid_B, valid_B, num_groups, group_size) -> Array:
  return _group_reduce_rows(valid_B.astype(jnp.float32), gid_B, valid_B, num_groups,
                            group_size, "sum")


def _group_moments_rows(reward_B, gid_B, valid_B, num_groups, group_size) -> ops.GroupMoments:
  """ops.group_moments(_dense) gathered back to rows: count, mean, unbiased std [B]."""
  if group_size is not None:
    mom = ops.group_moments_dense(reward_B.reshape(-1, group_size),
                                  valid_B.reshape(-1, group_size))
    rep = lambda a: jnp.broadcast_to(a[:, None], (a.shape[0], group_size)).reshape(-1)
  else:
    mom = ops.group_moments(reward_B, gid_B, num_groups, valid_B)
    rep = lambda a: ops.gather_groups(a, gid_B)
  return ops.GroupMoments(count=rep(mom.count), mean=rep(mom.mean), std=rep(mom.std))


def _weighted_whiten(x_B: Array, weight_B: Array, eps: float = 1e-8) -> Array:
  """Whitening of per-row values where row i counts `weight_B[i]` times.

  With `weight_B` = response lengths this equals
  `ops.masked_whiten(broadcast_to_tokens(x_B, M), M)` on the valid tokens
  (verl whitens the broadcast [B,T] array), at O(B) instead of O(B·T).
  Two-pass (shift by a first mean, then correct) for accuracy. Rows with zero
  weight give 0; so does everything when the total weight is below 2.
  """
  w = weight_B.astype(jnp.float32)
  n = jnp.sum(w)
  m1 = jnp.sum(w * x_B) / jnp.maximum(n, 1.0)
  d = jnp.where(w > 0, x_B - m1, 0.0)
  c = d - jnp.sum(w * d) / jnp.maximum(n, 1.0)
  var = jnp.sum(w * c * c) / jnp.maximum(n - 1.0, 1.0)
  return jnp.where((w > 0) & (n > 1), c * jax.lax.rsqrt(var + eps), 0.0)


def _is_one(x) -> bool:
  """True for a Python number equal to 1 (a static fact; traced values are never 'one')."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


def _cumsum_last(x_BT: Array, block: int = 16) -> Array:
  """Forward cumsum along the last axis, blocked for XLA CPU.

  XLA CPU runs a reverse cumsum several times faster than a forward one, so the
  in-block prefix sums are (block total − reverse cumsum + x) and the block
  offsets a short forward cumsum over T/block totals. Rounding is that of the
  block sums, as for a plain cumsum. Falls back to jnp.cumsum when T % block.
  """
  B, T = x_BT.shape
  if T % block:
    return jnp.cumsum(x_BT, axis=-1)
  x_BKC = x_BT.reshape(B, T // block, block)
  rev_BKC = jax.lax.cumsum(x_BKC, axis=2, reverse=True)
  tot_BK = rev_BKC[:, :, 0]
  off_BK = jnp.cumsum(tot_BK, axis=1) - tot_BK
  return (tot_BK[:, :, None] - rev_BKC + x_BKC + off_BK[:, :, None]).reshape(B, T)


def _apply_singleton(adv_B, raw_B, count_B, singleton) -> Array:
  if singleton == "raw":
    return jnp.where(count_B == 1, raw_B, adv_B)
  return jnp.where(count_B == 1, 0.0, adv_B)


# --------------------------------------------------------------------------
# GRPO family.
# --------------------------------------------------------------------------


def _grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, scale, eps, singleton):
  """Per-row GRPO advantage [B] for `scale` in {"group", "batch", "none"}."""
  if scale in ("group", "none"):
    return ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B,
                               scale=scale == "group", eps=eps, singleton=singleton,
                               group_size=group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)
  std_b = ops.safe_sqrt(ops.masked_var(reward_B, valid_B))
  adv_B = cen_B / (std_b + eps)
  if singleton == "raw":
    count_B = _group_count_rows(gid_B, valid_B, num_groups, group_size)
    adv_B = jnp.where(valid_B & (count_B == 1), reward_B, adv_B)
  return adv_B


@register_estimator("grpo", needs=("reward", "group_id", "response_mask"), paper=_P_GRPO,
                    static_argnames=("num_groups", "group_size", "scale", "singleton"))
def grpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, group_size: int | None = None,
                    scale: Literal["group", "batch", "none"] = "group", eps: float = 1e-6,
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GRPO group-relative advantage, broadcast to the response tokens.

  Paper: "DeepSeekMath" (Shao et al.), arXiv 2402.03300, §4.1.2 (outcome supervision).

  .. math::
    a_i = (R_i − μ_g) / (σ_g + ε),   A[i,t] = a_i · M[i,t]

  with μ_g the group mean and σ_g the unbiased (Bessel) group std (torch.std).
  Verified against verl `core_algos.py` `compute_grpo_outcome_advantage`
  (ε added to σ, not to the variance, so all-equal groups give exactly 0).

  `scale`:
    * "group": divide by the group std (GRPO, verl `norm_adv_by_std_in_grpo=True`);
    * "batch": centre per group, divide by the unbiased std of all valid rewards
      in the batch (TRL `GRPOTrainer` `scale_rewards="batch"`, the "group mean,
      batch std" variant; verl has no such switch — TRL uses ε=1e-4 there,
      we keep `eps`);
    * "none": no division (Dr.GRPO, arXiv 2503.20783).

  Deviation: singleton groups give 0 by default (verl: raw reward; use
  `singleton="raw"`); fully masked rows are excluded from the statistics.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group of each row in [0, num_groups); unused when
      `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    scale: "group" | "batch" | "none".
    eps: added to the std.
    singleton: "zero" | "raw" (see module docstring).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  >>> import numpy as np
  >>> a = grpo_advantages(reward=np.array([1., 0, 0, 1]), group_id=np.zeros(4, np.int32),
  ...                     response_mask=np.ones((4, 2), bool), num_groups=1)
  >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
  [0.866, -0.866, -0.866, 0.866]
  """
  _check_choice("grpo_advantages", "scale", scale, _SCALES)
  _check_choice("grpo_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "grpo_advantages", reward, group_id, response_mask, num_groups, group_size)
  adv_B = _grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, scale, eps, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


@register_estimator("dr_grpo", needs=("reward", "group_id", "response_mask"), paper=_P_DRGRPO,
                    static_argnames=("num_groups", "group_size", "singleton"))
def dr_grpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                       num_groups: int, group_size: int | None = None,
                       singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Dr.GRPO advantage: the group-mean baseline without std division.

  Paper: "Understanding R1-Zero-Like Training: A Critical Perspective",
  arXiv 2503.20783, §3.2: a_i = R_i − μ_g, A[i,t] = a_i·M[i,t]. The paper's
  other change (a constant loss normaliser instead of 1/|o_i|) belongs to the
  loss (`seq-mean-token-sum-norm`), not here. Verified against verl
  `compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False)`.

  Args/Returns: as `grpo_advantages` (no `scale`, no `eps`).
  """
  _check_choice("dr_grpo_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "dr_grpo_advantages", reward, group_id, response_mask, num_groups, group_size)
  adv_B = _grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, "none", 0.0, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


@register_estimator("rloo", needs=("reward", "group_id", "response_mask"), paper=_P_RLOO,
                    static_argnames=("num_groups", "group_size", "singleton"))
def rloo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, group_size: int | None = None,
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """REINFORCE leave-one-out (RLOO) advantage.

  Paper: "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
  from Human Feedback in LLMs", arXiv 2402.14740, eq. 6.

  .. math::
    a_i = R_i − (S_g − R_i)/(n_g − 1) = n_g/(n_g − 1) · (R_i − μ_g)

  computed in the second form from the accurately centred reward. Verified
  against verl `compute_rloo_outcome_advantage` (n_g = 1: verl keeps R_i;
  here 0 unless `singleton="raw"`).

  Args/Returns: as `dr_grpo_advantages`.
  """
  _check_choice("rloo_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "rloo_advantages", reward, group_id, response_mask, num_groups, group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)
  n_B = _group_count_rows(gid_B, valid_B, num_groups, group_size)
  adv_B = cen_B * n_B / jnp.maximum(n_B - 1.0, 1.0)
  adv_B = _apply_singleton(adv_B, reward_B, n_B, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


# --------------------------------------------------------------------------
# REINFORCE++ (token returns, batch whitening).
# --------------------------------------------------------------------------


def _token_rewards(fn, reward_B, mask_BT, logprob_old, logprob_ref, token_reward, kl_coef):
  """Outcome at the last valid token (+ dense rewards) − kl_coef·(logprob_old − logprob_ref).

  Returns None when there is no per-token term (outcome only).
  """
  if (logprob_old is None) != (logprob_ref is None):
    raise ValueError(f"{fn}: pass both logprob_old and logprob_ref (KL-in-reward) or neither")
  if logprob_old is None and isinstance(kl_coef, (int, float)) and kl_coef != 0:
    raise ValueError(f"{fn}: kl_coef={kl_coef} needs logprob_old and logprob_ref")
  if logprob_old is None and token_reward is None:
    return None
  x_BT = ops.outcome_to_token_rewards(reward_B, mask_BT)
  if token_reward is not None:
    tr_BT = jnp.asarray(token_reward, jnp.float32)
    chex.assert_equal_shape([tr_BT, mask_BT])
    x_BT = x_BT + jnp.where(mask_BT, tr_BT, 0.0)
  if logprob_old is not None:
    lo_BT = jnp.asarray(logprob_old, jnp.float32)
    lr_BT = jnp.asarray(logprob_ref, jnp.float32)
    chex.assert_equal_shape([lo_BT, lr_BT, mask_BT])
    x_BT = x_BT - kl_coef * jnp.where(mask_BT, lo_BT - lr_BT, 0.0)
  return x_BT


@register_estimator("reinforce_pp", needs=("reward", "response_mask"), paper=_P_RPP,
                    static_argnames=("whiten",),
                    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"})
def reinforce_pp_advantages(*, reward: ArrayLike, response_mask: ArrayLike,
                            logprob_old: ArrayLike | None = None,
                            logprob_ref: ArrayLike | None = None,
                            token_reward: ArrayLike | None = None, gamma: float = 1.0,
                            kl_coef: float = 0.0, whiten: bool = True) -> Array:
  """REINFORCE++: discounted token returns whitened over the whole batch.

  Paper: "REINFORCE++", arXiv 2501.03262, §3 (token-level KL penalty in the
  reward, global advantage normalisation).

  .. math::
    r_t = R·1[t = last valid] + token_reward_t − β·(logprob_old_t − logprob_ref_t)
    G_t = r_t + γ·G_{next valid t'}      (masked positions skipped)
    A   = masked_whiten(G, M)            (mean/unbiased var over all valid tokens)

  Verified against verl `compute_reinforce_plus_plus_outcome_advantage` and
  `torch_functional.masked_whiten`. Deviation: verl resets the running return
  at *every* masked position (a mid-response observation token cuts the return);
  here masked positions are skipped (ops.discounted_reverse_cumsum), as spec §0
  asks for multi-turn. Identical for right-padded single-turn responses.
  `logprob_old`/`logprob_ref`/`token_reward` are optional (the registry lists
  `reward, response_mask` as needs and the two log-probs as optional needs switched on by
  `kl_coef`); the KL term needs both log-probs.

  With outcome reward only, the return has a closed form
  `G_t = R·γ^{(valid tokens after t)}` (one reverse cumsum instead of a scan),
  and for a Python `gamma == 1` it is the row constant R, whitened in O(B). With
  dense terms and a Python `gamma == 1` the return is a reverse cumsum.

  Args:
    reward: [B] outcome rewards.
    response_mask: [B,T] bool.
    logprob_old, logprob_ref: optional [B,T] behaviour/reference log-probs.
    token_reward: optional [B,T] dense rewards added before the return.
    gamma: discount (may be traced).
    kl_coef: β of the k1 KL-in-reward penalty.
    whiten: static; False returns the raw returns G.

  Returns:
    [B,T] float32 advantages, zero outside the mask.

  >>> import numpy as np
  >>> m = np.array([[1, 1, 0], [1, 1, 1]], bool)
  >>> a = reinforce_pp_advantages(reward=np.array([1., 0.]), response_mask=m)
  >>> np.round(np.asarray(a, np.float64), 4).tolist()
  [[1.0954, 1.0954, 0.0], [-0.7303, -0.7303, -0.7303]]
  """
  reward_B = jnp.asarray(reward, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, mask_BT], [1, 2])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  mask_BT = mask_BT.astype(bool)
  x_BT = _token_rewards("reinforce_pp_advantages", reward_B, mask_BT, logprob_old, logprob_ref,
                        token_reward, kl_coef)
  if x_BT is None and _is_one(gamma):
    len_B = ops.sequence_lengths(mask_BT)
    adv_B = _weighted_whiten(reward_B, len_B) if whiten else reward_B
    return ops.broadcast_to_tokens(adv_B, mask_BT)
  if x_BT is None:
    maskf_BT = mask_BT.astype(jnp.float32)
    after_BT = jax.lax.cumsum(maskf_BT, axis=1, reverse=True) - maskf_BT  # valid tokens after t
    g = jnp.asarray(gamma, jnp.float32)
    ret_BT = jnp.where(mask_BT, reward_B[:, None] * jnp.power(g, after_BT), 0.0)
  else:
    ret_BT = ops.discounted_reverse_cumsum(x_BT, mask_BT, gamma)
  return ops.masked_whiten(ret_BT, mask_BT) if whiten else ret_BT


@register_estimator("reinforce_pp_baseline", needs=("reward", "group_id", "response_mask"),
                    paper=_P_RPP, static_argnames=("num_groups", "group_size", "singleton"))
def reinforce_pp_baseline_advantages(*, reward: ArrayLike, group_id: ArrayLike,
                                     response_mask: ArrayLike, num_groups: int,
                                     group_size: int | None = None,
                                     singleton: Literal["zero", "raw"] = "zero") -> Array:
  """REINFORCE++-baseline: group-mean baseline, then whitening over the batch tokens.

  Paper: "REINFORCE++", arXiv 2501.03262 (the "-baseline" variant for
  multi-sample prompts).

  .. math::
    s_i = R_i − μ_g,   A = masked_whiten(s_i · M, M)

  Verified against verl `compute_reinforce_plus_plus_baseline_outcome_advantage`
  (the broadcast [B,T] tile is whitened, so a row weighs by its length; computed
  here as a length-weighted whitening on [B], identical in value).
  Singletons: verl keeps R_i (μ=0); here 0 unless `singleton="raw"`.
  """
  _check_choice("reinforce_pp_baseline_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "reinforce_pp_baseline_advantages", reward, group_id, response_mask, num_groups, group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton=singleton, group_size=group_size)
  len_B = jnp.where(valid_B, ops.sequence_lengths(mask_BT), 0.0)
  return ops.broadcast_to_tokens(_weighted_whiten(cen_B, len_B), mask_BT)


# --------------------------------------------------------------------------
# Baselines other than the group mean.
# --------------------------------------------------------------------------


@register_estimator("remax", needs=("reward", "reward_baseline", "response_mask"), paper=_P_REMAX)
def remax_advantages(*, reward: ArrayLike, reward_baseline: ArrayLike,
                     response_mask: ArrayLike) -> Array:
  """ReMax: the reward of the greedy response is the baseline.

  Paper: "ReMax", arXiv 2310.10505, Algorithm 1: A_i = R(x, y_i) − R(x, ŷ_i),
  ŷ the greedy decode of the same prompt. Verified against verl
  `compute_remax_outcome_advantage` (reverse cumsum of the last-token outcome
  minus the baseline; equal to R_i − b_i on every valid token).

  Args:
    reward: [B] rewards of the sampled responses.
    reward_baseline: [B] reward of the greedy response to the same prompt (an
      extra greedy rollout + scoring the runner must produce).
    response_mask: [B,T] bool.

  Returns:
    [B,T] float32 advantages (R_i − b_i)·M.
  """
  reward_B = jnp.asarray(reward, jnp.float32)
  base_B = jnp.asarray(reward_baseline, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, base_B, mask_BT], [1, 1, 2])
  chex.assert_equal_shape([reward_B, base_B])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  return ops.broadcast_to_tokens(reward_B - base_B, mask_BT)


@register_estimator("opo", needs=("reward", "group_id", "response_mask"), paper=_P_OPO,
                    static_argnames=("num_groups", "group_size", "singleton"))
def opo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                   num_groups: int, group_size: int | None = None,
                   singleton: Literal["zero", "raw"] = "zero") -> Array:
  """OPO: the length-weighted mean reward of the group is the baseline.

  Paper: "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585, eq. 5
  (the variance-optimal baseline under the |o|-proportional gradient-norm
  approximation):

  .. math::
    b_g = Σ_{j∈g} |o_j|·R_j / Σ_{j∈g} |o_j|,   a_i = R_i − b_g

  Verified against verl `compute_opo_outcome_advantage`. Computed as
  (R_i − μ_g) − Σ|o|(R − μ_g)/Σ|o| to avoid cancellation for large rewards.
  Singletons: verl gives R_i (baseline 0); here 0 unless `singleton="raw"`.
  """
  _check_choice("opo_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "opo_advantages", reward, group_id, response_mask, num_groups, group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)
  len_B = jnp.where(valid_B, ops.sequence_lengths(mask_BT), 0.0)
  num_B = _group_reduce_rows(len_B * cen_B, gid_B, valid_B, num_groups, group_size, "sum")
  den_B = _group_reduce_rows(len_B, gid_B, valid_B, num_groups, group_size, "sum")
  adv_B = cen_B - _safe_div(num_B, den_B)
  n_B = _group_count_rows(gid_B, valid_B, num_groups, group_size)
  adv_B = _apply_singleton(adv_B, reward_B, n_B, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


@register_estimator("gpg", needs=("reward", "group_id", "response_mask"), paper=_P_GPG,
                    static_argnames=("num_groups", "group_size", "alpha", "scale", "singleton"))
def gpg_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                   num_groups: int, group_size: int | None = None,
                   alpha: Literal["valid_fraction", "nonzero_reward", "one"] = "valid_fraction",
                   scale: bool = False, eps: float = 1e-6,
                   singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GPG: group-mean baseline with the gradient-bias correction α.

  Paper: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
  Reasoning", arXiv 2504.02546, eq. 9-10:

  .. math::
    a_i = α · (R_i − μ_g) / F_norm,   α = B / (B − M)

  M = number of responses in groups whose rewards are all equal (they carry no
  gradient but still dilute the batch mean). F_norm = 1 by default (paper's best
  row), or the group std + ε with `scale=True`.

  `alpha`:
    * "valid_fraction" (paper; TRL `GPGTrainer` divides the loss by the same
      fraction of non-degenerate groups): α = B/(B − M), α = B when B = M
      (then every advantage is 0 anyway);
    * "nonzero_reward": verl `compute_gpg_outcome_advantage` parity,
      α = B / max(#{R_i ≠ 0}, 1) — verl counts non-zero *rewards*, which matches
      the paper only for some reward schemes;
    * "one": α = 1.
  B counts valid rows only. The paper's β_th resampling threshold is a trainer
  decision. Singletons count as degenerate; "raw" gives α·R_i (verl).
  """
  _check_choice("gpg_advantages", "alpha", alpha, ("valid_fraction", "nonzero_reward", "one"))
  _check_choice("gpg_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "gpg_advantages", reward, group_id, response_mask, num_groups, group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=bool(scale),
                              eps=eps, singleton="zero", group_size=group_size)
  n_valid = jnp.sum(valid_B.astype(jnp.float32))
  if alpha == "valid_fraction":
    gmax = _group_reduce_rows(reward_B, gid_B, valid_B, num_groups, group_size, "max")
    gmin = _group_reduce_rows(reward_B, gid_B, valid_B, num_groups, group_size, "min")
    n_degenerate = jnp.sum((valid_B & (gmax == gmin)).astype(jnp.float32))
    a = n_valid / jnp.maximum(n_valid - n_degenerate, 1.0)
  elif alpha == "nonzero_reward":
    a = n_valid / jnp.maximum(jnp.sum((valid_B & (reward_B != 0)).astype(jnp.float32)), 1.0)
  else:
    a = jnp.float32(1.0)
  adv_B = a * cen_B
  if singleton == "raw":
    n_B = _group_count_rows(gid_B, valid_B, num_groups, group_size)
    adv_B = jnp.where(n_B == 1, a * reward_B, adv_B)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


@register_estimator("grpo_passk", needs=("reward", "group_id", "response_mask"), paper=_P_PASSK,
                    static_argnames=("num_groups", "group_size", "method", "k", "scale",
                                     "singleton"))
def grpo_passk_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                          num_groups: int, group_size: int | None = None,
                          method: Literal["best_vs_second", "analytic"] = "best_vs_second",
                          k: int = 4, scale: bool = True, eps: float = 1e-6,
                          singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Pass@k-style group advantages (two published forms).

  `method="best_vs_second"` (verl `compute_grpo_passk_outcome_advantage`, after
  arXiv 2503.19595): only the best response of a group is credited,

  .. math::
    a_i = (R_i − max_{j≠i} R_j)_+ / (σ_g + ε)     (σ-division iff `scale`)

  i.e. r_max − r_second for the unique arg-max and 0 for every other row (a
  tie at the top gives 0 to all, as in verl, without picking an index).

  `method="analytic"` (Pass@k Training, arXiv 2508.10751, §3.3 analytic
  advantage; verified against RUCAIBox/Passk_Training `code/passk_adv.py`):
  with n responses of which c are correct (R_i > 0),

  .. math::
    ρ = 1 − C(n−c, k)/C(n, k),   σ = sqrt(ρ(1−ρ))
    A_pos = (1 − ρ)/(σ + ε),     A_neg = (1 − ρ − C(n−c−1, k−1)/C(n−1, k−1))/(σ + ε)

  Ratios of binomials are evaluated as products of k static factors; k > n is
  read as k = n (pass@n). Deviation: the reference code maps only rewards
  exactly 1/0; here correct means R > 0 (binary 0/1 or ±1 rewards agree).
  `scale` is unused by "analytic". Singletons give 0 (verl raises).
  """
  _check_choice("grpo_passk_advantages", "method", method, ("best_vs_second", "analytic"))
  _check_choice("grpo_passk_advantages", "singleton", singleton, _SINGLETONS)
  _check_int("grpo_passk_advantages", "k", k)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "grpo_passk_advantages", reward, group_id, response_mask, num_groups, group_size)
  n_B = _group_count_rows(gid_B, valid_B, num_groups, group_size)
  if method == "best_vs_second":
    gmax_B = _group_reduce_rows(reward_B, gid_B, valid_B, num_groups, group_size, "max")
    at_max = valid_B & (reward_B == gmax_B)
    n_at_max = _group_reduce_rows(at_max.astype(jnp.float32), gid_B, valid_B, num_groups,
                                  group_size, "sum")
    below = jnp.where(reward_B < gmax_B, reward_B, -jnp.inf)
    second_B = _group_reduce_rows(below, gid_B, valid_B, num_groups, group_size, "max")
    unique_best = at_max & (n_at_max == 1) & (n_B > 1)
    gap_B = jnp.where(unique_best, gmax_B - jnp.where(unique_best, second_B, gmax_B), 0.0)
    if scale:
      std_B = _group_moments_rows(reward_B, gid_B, valid_B, num_groups, group_size).std
      gap_B = gap_B / (std_B + eps)
    adv_B = gap_B
  else:
    correct_B = valid_B & (reward_B > 0)
    c_B = _group_reduce_rows(correct_B.astype(jnp.float32), gid_B, valid_B, num_groups,
                             group_size, "sum")
    miss = jnp.ones_like(n_B)   # C(n−c, k)/C(n, k)
    miss1 = jnp.ones_like(n_B)  # C(n−c−1, k−1)/C(n−1, k−1)
    for i in range(k):
      miss = miss * jnp.where(i < n_B, jnp.maximum(n_B - c_B - i, 0.0)
                              / jnp.maximum(n_B - i, 1.0), 1.0)
      if i < k - 1:
        miss1 = miss1 * jnp.where(i < n_B - 1, jnp.maximum(n_B - c_B - 1.0 - i, 0.0)
                                  / jnp.maximum(n_B - 1.0 - i, 1.0), 1.0)
    rho = 1.0 - miss
    sigma = ops.safe_sqrt(rho * (1.0 - rho))
    adv_B = jnp.where(correct_B, (1.0 - rho) / (sigma + eps),
                      (1.0 - rho - miss1) / (sigma + eps))
  adv_B = _apply_singleton(adv_B, reward_B, n_B, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


@register_estimator("gdpo", needs=("reward_components", "group_id", "response_mask"),
                    paper=_P_GDPO,
                    static_argnames=("num_groups", "group_size", "batch_norm", "singleton"))
def gdpo_advantages(*, reward_components: ArrayLike, group_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, group_size: int | None = None,
                    weights: ArrayLike | None = None,
                    batch_norm: Literal["token", "sequence", "none"] = "token",
                    eps: float = 1e-6, singleton: Literal["zero", "raw"] = "zero") -> Array:
  """GDPO: normalise each reward component per group, sum, then normalise the batch.

  Paper: "GDPO: Group reward-Decoupled Normalization Policy Optimization for
  Multi-reward RL Optimization", arXiv 2601.05242 (NVlabs).

  .. math::
    A_k[i] = (r_k[i] − μ_{g,k}) / (σ_{g,k} + ε)     (GRPO per component k)
    s_i    = Σ_k w_k · A_k[i]
    A      = whiten(s)

  `batch_norm`:
    * "token" (default): `masked_whiten` of the broadcast [B,T] array (every
      token counts, so long rows weigh more), as in the authors' verl code
      (NVlabs/GDPO `verl-GDPO/.../ray_trainer.py`) and verl's
      `compute_gdpo_outcome_advantage`; computed here in O(B);
    * "sequence": (s − mean)/(std + ε) over valid rows (TRL
      `multi_objective_aggregation="normalize_then_sum"`; TRL uses ε=1e-4);
    * "none": s.

  Args:
    reward_components: [B,R] float, one column per reward function.
    weights: optional [R] weights w_k (default 1).
    Others as `grpo_advantages`.
  """
  _check_choice("gdpo_advantages", "batch_norm", batch_norm, ("token", "sequence", "none"))
  _check_choice("gdpo_advantages", "singleton", singleton, _SINGLETONS)
  comps_BR = jnp.asarray(reward_components, jnp.float32)
  chex.assert_rank(comps_BR, 2)
  _, gid_B, mask_BT, valid_B = _outcome_inputs(
      "gdpo_advantages", comps_BR[:, 0], group_id, response_mask, num_groups, group_size)
  norm_BR = jax.vmap(
      lambda r: _grpo_scalar(r, gid_B, valid_B, num_groups, group_size, "group", eps, singleton),
      in_axes=1, out_axes=1)(comps_BR)
  if weights is None:
    s_B = jnp.sum(norm_BR, axis=1)
  else:
    w_R = jnp.asarray(weights, jnp.float32)
    chex.assert_shape(w_R, (comps_BR.shape[1],))
    s_B = jnp.sum(norm_BR * w_R[None, :], axis=1)
  s_B = jnp.where(valid_B, s_B, 0.0)
  if batch_norm == "token":
    len_B = jnp.where(valid_B, ops.sequence_lengths(mask_BT), 0.0)
    s_B = _weighted_whiten(s_B, len_B)
  elif batch_norm == "sequence":
    std = ops.safe_sqrt(ops.masked_var(s_B, valid_B))
    s_B = (s_B - ops.masked_mean(s_B, valid_B)) / (std + eps)
  return ops.broadcast_to_tokens(jnp.where(valid_B, s_B, 0.0), mask_BT)


# --------------------------------------------------------------------------
# Critic / token-level baselines.
# --------------------------------------------------------------------------


class GAEOutput(NamedTuple):
  """`advantages` [B,T] (whitened unless asked otherwise) and value targets `returns` [B,T]."""
  advantages: Array
  returns: Array


@register_estimator("gae", needs=("reward", "values", "response_mask"), paper=_P_GAE,
                    static_argnames=("whiten",), returns_output=True,
                    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"})
def gae_advantages(*, reward: ArrayLike, values: ArrayLike, response_mask: ArrayLike,
                   logprob_old: ArrayLike | None = None, logprob_ref: ArrayLike | None = None,
                   token_reward: ArrayLike | None = None, gamma: float = 1.0, lam: float = 1.0,
                   kl_coef: float = 0.0, whiten: bool = True) -> GAEOutput:
  """PPO's generalised advantage estimate with a critic, skipping masked tokens.

  Paper: "High-Dimensional Continuous Control Using Generalized Advantage
  Estimation", arXiv 1506.02438, eq. 16. Over valid positions only (spec §5):

  .. math::
    δ_t = r_t + γ·V_{next valid} − V_t,    Â_t = δ_t + γλ·Â_{next valid}
    returns_t = Â_t + V_t,                  A = masked_whiten(Â, M)

  r_t is the outcome on the last valid token plus optional dense rewards minus
  the k1 KL-in-reward term β·(logprob_old − logprob_ref). Observation tokens
  (M=0) carry V_next and the running Â through unchanged; the value after the
  last valid token is 0. Verified against verl `compute_gae_advantage_return`
  (its multi-turn version skips observation tokens the same way); here with
  ops.next_valid_value and ops.discounted_reverse_cumsum instead of a loop.
  For Python `gamma == lam == 1` (verl's default) the sum telescopes to
  Â_t = G_t − V_t (G the reward-to-go), computed without any scan.

  Args:
    reward: [B] outcome rewards.
    values: [B,T] critic values at each position (masked positions ignored).
    response_mask: [B,T] bool.
    logprob_old, logprob_ref, token_reward, kl_coef: as `reinforce_pp_advantages`.
    gamma, lam: discount and GAE λ (may be traced).
    whiten: static; whiten the advantages over all valid tokens (verl does).

  Returns:
    GAEOutput(advantages [B,T], returns [B,T]); both zero outside the mask.

  >>> import numpy as np
  >>> out = gae_advantages(reward=np.array([1.]), values=np.array([[.5, .6, .8]]),
  ...                      response_mask=np.ones((1, 3), bool), lam=.95, whiten=False)
  >>> [np.round(np.asarray(x, np.float64), 4).tolist() for x in out]
  [[[0.4705, 0.39, 0.2]], [[0.9705, 0.99, 1.0]]]
  """
  reward_B = jnp.asarray(reward, jnp.float32)
  values_BT = jnp.asarray(values, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, values_BT, mask_BT], [1, 2, 2])
  chex.assert_equal_shape([values_BT, mask_BT])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  mask_BT = mask_BT.astype(bool)
  x_BT = _token_rewards("gae_advantages", reward_B, mask_BT, logprob_old, logprob_ref,
                        token_reward, kl_coef)
  values_BT = jnp.where(mask_BT, values_BT, 0.0)
  if _is_one(gamma) and _is_one(lam):
    # γ = λ = 1 (verl's default): the TD errors telescope, Â_t = G_t − V_t exactly.
    if x_BT is None:   # outcome only: G_t = R on every valid token
      returns_BT = ops.broadcast_to_tokens(reward_B, mask_BT)
    else:
      returns_BT = ops.discounted_reverse_cumsum(x_BT, mask_BT, 1.0)
    adv_BT = jnp.where(mask_BT, returns_BT - values_BT, 0.0)
  else:
    if x_BT is None:
      x_BT = ops.outcome_to_token_rewards(reward_B, mask_BT)
    g = jnp.asarray(gamma, jnp.float32)
    delta_BT = x_BT + g * ops.next_valid_value(values_BT, mask_BT) - values_BT
    adv_BT = ops.discounted_reverse_cumsum(delta_BT, mask_BT,
                                           g * jnp.asarray(lam, jnp.float32))
    returns_BT = jnp.where(mask_BT, adv_BT + values_BT, 0.0)
  if whiten:
    adv_BT = ops.masked_whiten(adv_BT, mask_BT)
  return GAEOutput(advantages=adv_BT, returns=returns_BT)


def _group_token_sums(x_BTC: Array, key_BT: Array, num_keys: int) -> Array:
  """Σ of x over all tokens sharing a key, read back at every token ([B,T,C] -> [B,T,C]).

  `key_BT` in [0, num_keys]; key == num_keys is a dropped bucket.
  """
  B, T, C = x_BTC.shape
  flat = jax.ops.segment_sum(x_BTC.reshape(B * T, C), key_BT.reshape(B * T), num_keys + 1)
  return flat[key_BT.reshape(B * T)].reshape(B, T, C)


@register_estimator("optimal_token_baseline",
                    needs=("reward", "group_id", "response_mask", "logprob_old",
                           "sum_pi_squared"),
                    paper=_P_OTB,
                    static_argnames=("num_groups", "group_size", "align", "handle_zero_tail",
                                     "singleton"))
def optimal_token_baseline_advantages(
    *, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
    logprob_old: ArrayLike, sum_pi_squared: ArrayLike, num_groups: int,
    group_size: int | None = None, token_reward: ArrayLike | None = None,
    is_weights: ArrayLike | None = None, align: Literal["position", "valid_index"] = "position",
    handle_zero_tail: bool = True, eps: float = 1e-8,
    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Optimal Token Baseline (OTB): a per-token, variance-weighted group baseline.

  Paper: "Optimal Token Baseline", arXiv 2602.07078 (verl docs
  `algo/otb.md`). Verified against verl `compute_optimal_token_baseline_advantage`
  (align="position") and `compute_multi_turn_optimal_token_baseline_advantage`
  (align="valid_index", tokens aligned by their index among the valid tokens).

  .. math::
    G_t  = Σ_{t'≥t, valid} r_{t'}                   (reward-to-go, γ = 1)
    w_j  = 1 − 2π_j + Σ_v π_j(v)²   (× ρ̄_j² with `is_weights`),  π_j = exp(logprob_old_j)
    W_t  = Σ_{j≤t, valid} w_j                        (realized energy)
    B*_t = Σ_{i∈g} G_t^{(i)} W_t^{(i)} / (Σ_{i∈g} W_t^{(i)} + ε)
    A_t  = (G_t − B*_t)·M_t

  The sums run over the valid rows of the group that have a valid token at t
  (same column for "position": rows of a group share the prompt, so columns
  line up). `handle_zero_tail`: where only one row of the group is valid at t
  (verl: the unique longest row beyond the second-longest length), B*_t = 0
  and A_t = G_t. Outcome part computed as (R − μ_g) − B*' + μ_g·ε/(ΣW+ε), which
  is the same number without cancellation for large rewards. Singleton groups:
  verl returns G (baseline 0); here 0 unless `singleton="raw"`.

  Args:
    reward: [B] outcome (placed on the last valid token).
    logprob_old: [B,T] log-prob of the sampled token under the behaviour policy.
    sum_pi_squared: [B,T] Σ_v π(v)² of the behaviour distribution at each
      position (a by-product of scoring: exp(logsumexp(2z) − 2·logsumexp(z))).
    token_reward: optional [B,T] dense rewards added to the return.
    is_weights: optional [B,T] truncated rollout importance weights ρ̄.
    align: "position" | "valid_index" (multi-turn / TIR variant).
    handle_zero_tail: static, see above (verl default True).
    eps: added to Σ W.
    Others as `grpo_advantages`.

  Returns:
    [B,T] float32 advantages, zero outside the mask.
  """
  _check_choice("optimal_token_baseline_advantages", "align", align, ("position", "valid_index"))
  _check_choice("optimal_token_baseline_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "optimal_token_baseline_advantages", reward, group_id, response_mask, num_groups,
      group_size)
  lp_BT = jnp.asarray(logprob_old, jnp.float32)
  sp_BT = jnp.asarray(sum_pi_squared, jnp.float32)
  chex.assert_equal_shape([lp_BT, sp_BT, mask_BT])
  B, T = mask_BT.shape
  mv_BT = mask_BT & valid_B[:, None]

  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)
  mu_B = reward_B - cen_B
  if token_reward is not None:
    tr_BT = jnp.asarray(token_reward, jnp.float32)
    chex.assert_equal_shape([tr_BT, mask_BT])
    tail_BT = ops.discounted_reverse_cumsum(tr_BT, mask_BT, 1.0)
  else:
    tail_BT = jnp.zeros((B, T), jnp.float32)
  gc_BT = jnp.where(mv_BT, cen_B[:, None] + tail_BT, 0.0)      # G − μ_g
  gfull_BT = jnp.where(mv_BT, reward_B[:, None] + tail_BT, 0.0)  # G

  w_BT = 1.0 - 2.0 * jnp.exp(jnp.where(mv_BT, lp_BT, 0.0)) + jnp.where(mv_BT, sp_BT, 0.0)
  if is_weights is not None:
    iw_BT = jnp.asarray(is_weights, jnp.float32)
    chex.assert_equal_shape([iw_BT, mask_BT])
    w_BT = w_BT * jnp.square(jnp.where(mv_BT, iw_BT, 0.0))
  cumw_BT = jnp.where(mv_BT, _cumsum_last(jnp.where(mv_BT, w_BT, 0.0)), 0.0)

  n_B = _group_count_rows(gid_B, valid_B, num_groups, group_size)
  # Column sums over the rows of a group. Work in a view where they broadcast:
  # [N,G,T] on the fast path, [B,T] with row gathers on the segment path.
  if align == "position":
    # Row segment sums (B updates of T values) beat a [N,G,T] middle-axis reduction on CPU.
    if group_size is not None:
      seg_B, n_seg = jnp.arange(B, dtype=jnp.int32) // group_size, B // group_size
    else:
      seg_B, n_seg = jnp.where(valid_B, gid_B, num_groups), num_groups + 1
    view = lambda a_BT: a_BT
    row = lambda a_B: a_B[:, None]
    colsum = lambda a_BT: jax.ops.segment_sum(a_BT, seg_B, n_seg,
                                              indices_are_sorted=group_size is not None)[seg_B]
  else:
    seg_B = gid_B if group_size is None else jnp.arange(B, dtype=jnp.int32) // group_size
    n_seg = num_groups if group_size is None else B // group_size
    mvi_BT = mv_BT.astype(jnp.int32)   # index among valid tokens = (#valid) − (#valid from t on)
    pos_BT = jnp.sum(mvi_BT, axis=-1, keepdims=True) - jax.lax.cumsum(mvi_BT, axis=1, reverse=True)
    key_BT = jnp.where(mv_BT, seg_B[:, None] * T + pos_BT, n_seg * T)
    view = lambda a_BT: a_BT
    row = lambda a_B: a_B[:, None]
    colsum = lambda a_BT: _group_token_sums(a_BT[..., None], key_BT, n_seg * T)[..., 0]
  gc, cumw, mv = view(gc_BT), view(cumw_BT), view(mv_BT)
  num = colsum(gc_BT * cumw_BT)
  inv = 1.0 / (colsum(cumw_BT) + eps)
  adv = gc - num * inv + row(mu_B) * eps * inv
  if handle_zero_tail:
    adv = jnp.where(colsum(mv_BT.astype(jnp.float32)) == 1, view(gfull_BT), adv)
  single = row(n_B) == 1
  adv = jnp.where(single, view(gfull_BT) if singleton == "raw" else 0.0, adv)
  return jnp.where(mv, adv, 0.0).reshape(B, T)


# --------------------------------------------------------------------------
# DAPO.
# --------------------------------------------------------------------------


def dapo_overlong_penalty(response_length: ArrayLike, max_length: ArrayLike,
                          cache_length: ArrayLike, penalty_factor: ArrayLike = 1.0) -> Array:
  """DAPO soft overlong punishment R_len(|y|) (arXiv 2503.14476, eq. 13).

  .. math::
    L_exp = L_max − L_cache
    R_len = 0                              if |y| ≤ L_exp
          = (L_exp − |y|)/L_cache · f       if L_exp < |y| ≤ L_max
          = −f                              if |y| > L_max

  verl (`reward_manager/dapo.py`) computes min(−(|y| − L_exp)/L_cache·f, 0)
  and never sees |y| > L_max (responses are truncated); the clip at −f follows
  the paper. Added to the task reward before group normalisation.

  Args:
    response_length: [B] (or any shape) response lengths |y|.
    max_length: L_max (generation budget).
    cache_length: L_cache (> 0), the soft-punishment buffer.
    penalty_factor: f.

  Returns:
    float32 penalties of the shape of `response_length`, in [−f, 0].

  >>> dapo_overlong_penalty(jnp.array([16000, 18432, 20480, 30000]), 20480, 4096).tolist()
  [0.0, -0.5, -1.0, -1.0]
  """
  if isinstance(cache_length, (int, float)) and cache_length <= 0:
    raise ValueError(f"dapo_overlong_penalty: cache_length must be > 0, got {cache_length}")
  if (isinstance(cache_length, (int, float)) and isinstance(max_length, (int, float))
      and cache_length > max_length):
    raise ValueError(f"dapo_overlong_penalty: cache_length={cache_length} exceeds "
                     f"max_length={max_length}")
  length = jnp.asarray(response_length, jnp.float32)
  f = jnp.asarray(penalty_factor, jnp.float32)
  cache = jnp.asarray(cache_length, jnp.float32)
  expected = jnp.asarray(max_length, jnp.float32) - cache
  return jnp.clip(-(length - expected) / cache * f, -f, 0.0)


def dapo_keep_mask(metric: ArrayLike, group_id: ArrayLike | None, num_groups: int,
                   group_size: int | None = None, valid: ArrayLike | None = None) -> Array:
  """DAPO dynamic-sampling filter as a row mask (arXiv 2503.14476, eq. 11 constraint).

  keep_g = 1[min_{i∈g} m_i < max_{i∈g} m_i]: a group whose metric (accuracy by
  default) is the same for all members — all solved or all failed — is dropped
  entirely; a single-member group is dropped too. Multiply the result into
  `response_mask`; the refill-until-full loop belongs to the trainer.
  Verified against verl `docs/algo/dapo.md` / `dapo_ray_trainer.py` filter.

  Args:
    metric: [B] per-row filter metric (e.g. accuracy).
    group_id: [B] int32 group ids (unused with `group_size`).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    valid: optional [B] bool rows to consider (invalid rows are never kept).

  Returns:
    [B] bool keep mask.
  """
  m_B = jnp.asarray(metric, jnp.float32)
  chex.assert_rank(m_B, 1)
  B = m_B.shape[0]
  _check_groups("dapo_keep_mask", B, num_groups, group_size)
  ok_B = jnp.ones((B,), bool) if valid is None else jnp.asarray(valid, bool)
  if group_id is None:
    if group_size is None:
      raise ValueError("dapo_keep_mask: group_id is required on the segment path")
    gid_B = jnp.arange(B, dtype=jnp.int32) // group_size
  else:
    gid_B = jnp.asarray(group_id, jnp.int32)
    chex.assert_equal_shape([gid_B, m_B])
    if group_size is None:
      ok_B = ok_B & (gid_B >= 0) & (gid_B < num_groups)
  gmax = _group_reduce_rows(m_B, gid_B, ok_B, num_groups, group_size, "max")
  gmin = _group_reduce_rows(m_B, gid_B, ok_B, num_groups, group_size, "min")
  return ok_B & (gmin < gmax)


@register_estimator("dapo", needs=("reward", "group_id", "response_mask"), paper=_P_DAPO,
                    static_argnames=("num_groups", "group_size", "singleton"))
def dapo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    num_groups: int, group_size: int | None = None,
                    max_length: int | None = None, cache_length: int = 4096,
                    penalty_factor: float = 1.0, eps: float = 1e-6,
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """DAPO advantage: GRPO z-score of the task reward plus the soft overlong penalty.

  Paper: "DAPO", arXiv 2503.14476, §3.4 and eq. 13. R'_i = R_i + R_len(|o_i|)
  (`dapo_overlong_penalty`, |o_i| = Σ_t M[i,t]) when `max_length` is given,
  then a_i = (R'_i − μ_g)/(σ_g + ε) broadcast to tokens. Clip-higher and
  token-mean aggregation live in the loss; dynamic sampling is
  `dapo_keep_mask` (multiply it into `response_mask`: dropped rows then take no
  part in the statistics here). Spec §7 defaults: L_max=20480, L_cache=4096, f=1.

  Args:
    max_length: L_max; None disables overlong shaping.
    cache_length: L_cache; penalty_factor: f.
    Others as `grpo_advantages`.
  """
  _check_choice("dapo_advantages", "singleton", singleton, _SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "dapo_advantages", reward, group_id, response_mask, num_groups, group_size)
  if max_length is not None:
    reward_B = reward_B + dapo_overlong_penalty(ops.sequence_lengths(mask_BT), max_length,
                                                cache_length, penalty_factor)
  adv_B = _grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, "group", eps, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


# --------------------------------------------------------------------------
# DCPO smooth advantage standardisation (stateful).
# --------------------------------------------------------------------------


class DCPOState(NamedTuple):
  """Per-prompt cumulative reward statistics, indexed by a stable prompt slot [P].

  count: int32 number of steps the prompt has been sampled before;
  mean, std: cumulative (pooled) mean and std of its rewards.
  """
  count: Array
  mean: Array
  std: Array


class DCPOOutput(NamedTuple):
  advantages: Array
  state: DCPOState


def dcpo_init_state(num_prompts: int) -> DCPOState:
  """Empty DCPO statistics for `num_prompts` prompt slots."""
  _check_int("dcpo_init_state", "num_prompts", num_prompts)
  return DCPOState(count=jnp.zeros((num_prompts,), jnp.int32),
                   mean=jnp.zeros((num_prompts,), jnp.float32),
                   std=jnp.zeros((num_prompts,), jnp.float32))


@register_estimator("dcpo", needs=("reward", "group_id", "response_mask", "prompt_id"),
                    paper=_P_DCPO, static_argnames=("num_groups", "group_size", "scale"),
                    stateful=True, returns_output=True)
def dcpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    prompt_id: ArrayLike, state: DCPOState, num_groups: int,
                    group_size: int | None = None, old_stats_ratio: float = 1.0,
                    scale: bool = True) -> DCPOOutput:
  """DCPO smooth advantage standardisation (SAS), with the updated prompt statistics.

  Paper: "DCPO: Dynamic Clipping Policy Optimization", arXiv 2509.02333, §3.2.
  Verified against elysiameik-afk/dcpomol (verl fork of the DCPO code)
  `core_algos.py` `get_mean_std` / `compute_dcpo_outcome_advantage`.

  For a group g seen n times before (state count n, mean μ_p, std σ_p, both
  scaled by `old_stats_ratio`), with current group mean μ_new and unbiased std
  σ_new, and i = n + 1:

  .. math::
    μ  = (n μ_p + μ_new)/(n+1)
    σ² = [n σ_p² + σ_new² + n/(n+1)·(μ_new − μ_p)²]/(n+1)
    A_new = (R − μ_new)/σ_new,   A_tot = (R − μ)/σ      (0 where the std is 0)
    SA_new = (i−1)/i·A_new + 1/i·A_tot,   SA_tot = 1/i·A_new + (i−1)/i·A_tot
    a = SA_new if |SA_new| < |SA_tot| else SA_tot

  n = 0 gives the plain z-score (no ε). The new state is (n+1, μ, σ) at every
  prompt slot present in the batch; other slots are unchanged. `scale=False`
  drops the std divisions (the code's `norm_adv_by_std_in_grpo=False`).

  Args:
    reward, group_id, response_mask, num_groups, group_size: as `grpo_advantages`.
    prompt_id: [B] int32 slot in `state` of each row's prompt (stable across
      steps; constant within a group; two groups of one batch must not share a
      slot — their updates would collide).
    state: `DCPOState` with arrays [P].
    old_stats_ratio: the code's `user_old_mean_ratio` (scales μ_p and σ_p).
    scale: static; divide by the stds.

  Returns:
    DCPOOutput(advantages [B,T], state DCPOState [P]).
  """
  reward_B, gid_B, mask_BT, valid_B = _outcome_inputs(
      "dcpo_advantages", reward, group_id, response_mask, num_groups, group_size)
  pid_B = jnp.asarray(prompt_id)
  chex.assert_rank(pid_B, 1)
  chex.assert_type(pid_B, int)
  chex.assert_equal_shape([pid_B, reward_B])
  count_P = jnp.asarray(state.count)
  mean_P = jnp.asarray(state.mean, jnp.float32)
  std_P = jnp.asarray(state.std, jnp.float32)
  chex.assert_rank([count_P, mean_P, std_P], 1)
  chex.assert_equal_shape([count_P, mean_P, std_P])
  P = count_P.shape[0]
  pid_B = pid_B.astype(jnp.int32)
  ok_B = valid_B & (pid_B >= 0) & (pid_B < P)

  ratio = jnp.asarray(old_stats_ratio, jnp.float32)
  n_B = jnp.where(ok_B, ops.gather_groups(count_P, pid_B), 0).astype(jnp.float32)
  mu_p = ops.gather_groups(mean_P, pid_B) * ratio
  sd_p = ops.gather_groups(std_P, pid_B) * ratio
  mom = _group_moments_rows(reward_B, gid_B, valid_B, num_groups, group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)   # R − μ_new
  dmu = mom.mean - mu_p
  frac = n_B / (n_B + 1.0)
  mu_tot = mu_p + dmu / (n_B + 1.0)
  var_tot = (n_B * sd_p * sd_p + mom.std * mom.std + frac * dmu * dmu) / (n_B + 1.0)
  sd_tot = ops.safe_sqrt(var_tot)
  dev_tot = cen_B + frac * dmu                                         # R − μ
  if scale:
    a_new = _safe_div(cen_B, mom.std)
    a_tot = _safe_div(dev_tot, sd_tot)
  else:
    a_new, a_tot = cen_B, dev_tot
  i_B = n_B + 1.0
  sa_new = (i_B - 1.0) / i_B * a_new + a_tot / i_B
  sa_tot = a_new / i_B + (i_B - 1.0) / i_B * a_tot
  adv_B = jnp.where(jnp.abs(sa_new) < jnp.abs(sa_tot), sa_new, sa_tot)
  adv_B = jnp.where(valid_B, adv_B, 0.0)

  idx_B = jnp.where(ok_B, pid_B, P)
  new_state = DCPOState(
      count=count_P.at[idx_B].set((n_B + 1.0).astype(count_P.dtype), mode="drop"),
      mean=mean_P.at[idx_B].set(mu_tot, mode="drop"),
      std=std_P.at[idx_B].set(sd_tot, mode="drop"))
  return DCPOOutput(advantages=ops.broadcast_to_tokens(adv_B, mask_BT), state=new_state)
