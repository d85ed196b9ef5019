"""SCOPE: dual-path, perplexity-weighted OPD (failed rollouts) / MLE (correct rollouts)."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.distill._teach import TEACHER_FLOOR, response_mask_of, teacher_gap
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["scope_advantages", "scope_weights", "SCOPE_NORMALIZATIONS", "SCOPE_STUDENT_WEIGHTS",
           "SCOPE_DISTILL_KINDS"]

_PAPER = ("SCOPE: Signal-Calibrated On-Policy Distillation Enhancement with Dual-Path "
          "Adaptive Weighting, arXiv 2604.10688")
_SOURCE = (_PAPER + "; code: machine981/SCOPE@085fdc2 verl/trainer/ppo/ray_trainer.py "
           "(_compute_scope_dual_path_weights, compute_advantage), "
           "verl/workers/actor/dp_actor.py (the weighted SFT term), run_experiment_*.sh")
SCOPE_NORMALIZATIONS = ("code", "paper")
SCOPE_STUDENT_WEIGHTS = ("confident", "uncertain")
SCOPE_DISTILL_KINDS = ("k1", "low_var_kl")


def _path_softmax(logit_B: Array, gid_B: Array, on_B: Array, num_groups: int,
                  group_size: int | None, times_n: bool) -> Array:
  """softmax of `logit` over the `on` rows of each group (× their count with `times_n`);
  a lone row gets 1, rows not `on` get 0 ([B])."""
  m_B = ops.group_reduce_rows(logit_B, gid_B, on_B, num_groups, group_size, "max")
  e_B = jnp.exp(jnp.where(on_B, logit_B - m_B, 0.0))         # ≤ 1, the group max gives 1
  e_B = jnp.where(on_B, e_B, 0.0)
  s_B = ops.group_reduce_rows(e_B, gid_B, on_B, num_groups, group_size, "sum")
  n_B = ops.group_count_rows(gid_B, on_B, num_groups, group_size)
  w_B = e_B / jnp.where(on_B, s_B, 1.0)
  w_B = jnp.where(n_B == 1, 1.0, w_B * n_B if times_n else w_B)
  return jnp.where(on_B, w_B, 0.0)


def scope_weights(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                  logprob_old: ArrayLike, logprob_teacher: ArrayLike, num_groups: int,
                  group_size: int | None = None, success_threshold: ArrayLike = 1.0,
                  temperature: ArrayLike = 1.0, teacher_floor: ArrayLike = TEACHER_FLOOR,
                  normalization: Literal["code", "paper"] = "code",
                  student_weight: Literal["confident", "uncertain"] = "confident"
                  ) -> tuple[Array, Array]:
  """SCOPE sequence weights w_b per (group, path) and the correct flag c_b.

  .. math::
    z_b = mean_t ℓᵀ_{b,t} / τ                          (failed rows: the teacher's confidence)
    z_b = ± mean_t ℓˢ_{b,t} / τ                        (correct rows; + "confident", − "uncertain")
    w_b = softmax_{b' ∈ g(b), c_{b'} = c_b}(z)_b · n    ("code": mean 1 per path)
    w_b = softmax_{b' ∈ g(b), c_{b'} = c_b}(z)_b        ("paper": sum 1 per path)

  with n the number of valid rows of b's group on b's path; a path with one row gives it
  weight 1. See `scope_advantages`.

  Args:
    reward, group_id, response_mask, logprob_old, logprob_teacher, num_groups, group_size,
    success_threshold, temperature, teacher_floor: as in `scope_advantages`.
    normalization: static, "code" | "paper".
    student_weight: static, "confident" | "uncertain".

  Returns:
    (w [B] float32, 0 on invalid rows; correct [B] bool).
  """
  check_choice("scope_weights", "normalization", normalization, SCOPE_NORMALIZATIONS)
  check_choice("scope_weights", "student_weight", student_weight, SCOPE_STUDENT_WEIGHTS)
  mask_BT = response_mask_of(response_mask)
  rows = ops.group_rows("scope_weights", reward, group_id, num_groups, group_size,
                        response_mask=mask_BT)
  lt_BT = jnp.asarray(logprob_teacher, jnp.float32)
  ls_BT = jnp.asarray(logprob_old, jnp.float32)
  chex.assert_equal_shape([lt_BT, ls_BT, mask_BT])
  lt_BT = jnp.maximum(jnp.where(mask_BT, lt_BT, 0.0), jnp.asarray(teacher_floor, jnp.float32))
  ls_BT = jnp.where(mask_BT, ls_BT, 0.0)
  correct_B = rows.values >= jnp.asarray(success_threshold, jnp.float32)
  sign = 1.0 if student_weight == "confident" else -1.0
  z_B = jnp.where(correct_B, sign * ops.masked_mean(ls_BT, mask_BT, axis=-1),
                  ops.masked_mean(lt_BT, mask_BT, axis=-1))
  z_B = z_B / jnp.asarray(temperature, jnp.float32)
  times_n = normalization == "code"
  w_B = (_path_softmax(z_B, rows.group_id, rows.valid & correct_B, num_groups, group_size,
                       times_n)
         + _path_softmax(z_B, rows.group_id, rows.valid & ~correct_B, num_groups, group_size,
                         times_n))
  return jax.lax.stop_gradient(w_B), correct_B


def _distill_signal(delta_BT: Array, kind: str) -> Array:
  """The per-token distillation reward from δ = ℓᵀ − ℓˢ: δ (k1) or −clip(k3, ±10)."""
  if kind == "k1":
    return delta_BT
  k3 = jnp.exp(jnp.minimum(delta_BT, 20.0)) - delta_BT - 1.0
  return -jnp.clip(k3, -10.0, 10.0)


@register_estimator(
    "scope", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher"),
    paper=_PAPER, confidence="code-verified", source=_SOURCE,
    static_argnames=("num_groups", "group_size", "normalization", "student_weight",
                     "distill_kind", "mle_token_scale"))
def scope_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                     response_mask: ArrayLike, logprob_old: ArrayLike,
                     logprob_teacher: ArrayLike, num_groups: int,
                     group_size: int | None = None, mle_coef: ArrayLike = 1.0,
                     temperature: ArrayLike = 1.0, success_threshold: ArrayLike = 1.0,
                     teacher_floor: ArrayLike = TEACHER_FLOOR,
                     normalization: Literal["code", "paper"] = "code",
                     student_weight: Literal["confident", "uncertain"] = "confident",
                     distill_kind: Literal["k1", "low_var_kl"] = "k1",
                     mle_token_scale: bool = True) -> Array:
  """SCOPE in advantage form: weighted OPD on failed rollouts, weighted MLE on correct ones.

  Rollouts are routed by correctness c_b = [R_b ≥ τ_c]. A failed rollout gets the teacher's
  distillation signal as its token advantage, weighted by how confident the teacher is on
  it; a correct one gets maximum likelihood, weighted by a student-perplexity score; both
  weights are normalised inside each (prompt group, path) (`scope_weights`):

  .. math::
    A_{b,t} = w_b · d_{b,t}                   if c_b = 0
    A_{b,t} = λ_{mle} · w_b · N / N_c         if c_b = 1
    d = δ ("k1"),   d = −clip(e^δ − δ − 1, −10, 10) ("low_var_kl"),   δ = max(ℓᵀ, −20) − ℓˢ

  with N the valid tokens of the batch and N_c those of its correct rows (N/N_c only with
  `mle_token_scale`).

  What the code does (machine981/SCOPE, the released `run_experiment_*.sh` settings) and
  how each part maps here:

  * Weights: per uid and path, softmax of (sign · mean log-prob / τ) times the path's size
    (`_compute_scope_dual_path_weights`; a lone row gets 1). The scripts set both sign
    flags to True, which makes the logit +mean ℓ on both paths: failed rows are weighted
    up where the teacher is confident (the paper's description) and correct rows where the
    *student is confident* — the opposite of the paper's "concentrate reinforcement on
    low-confidence samples". `student_weight="confident"` is the code as run (default),
    "uncertain" the paper's description. `normalization="code"` (default) gives each path
    mean weight 1 (the code's softmax·n); "paper" uses the softmax alone (sum 1 per path,
    the paper's Eqs. 4–5), which scales a path by 1/n and so weighs the MLE and distillation
    paths n_failed : n_correct instead of 1 : 1.
  * Failed path: the scripts put the distillation signal into the advantage
    (`distill_signal_in_loss=False`), −kl_penalty(ℓˢ, ℓᵀ) with `distill.kl_loss_type=kl`, i.e.
    d = ℓᵀ − ℓˢ ("k1", default), times the weight, through the PPO loss. Their
    `distill_loss_type=low_var_kl` acts only on the in-loss path the scripts switch off;
    "low_var_kl" here is that signal (never positive, clipped at 10) in the advantage.
  * Correct path: the code adds −w_b·log π over the correct rows' tokens, token-mean over
    those tokens only (`dp_actor.py`), beside a PPO loss whose advantages are 0 there. The
    scripts run one update per batch (mini-batch = batch, one epoch), where π = π_old; then
    the advantage λ w_b N/N_c under the token-mean PPO loss has exactly that gradient
    (`mle_token_scale=True`). Off-policy (several epochs) the PPO clip would cap it where
    the code's term is unclipped. With False, A = λ w_b (token mean over all tokens).

  Deviations: a row is correct when R ≥ `success_threshold` (code: R > 0; the same on
  {0, 1} rewards); ℓᵀ is floored at −20 (the code does not floor); rows with an empty
  response or an out-of-range group take part in nothing. Not zero in equal-reward groups
  (an all-correct group is pure weighted MLE, an all-failed one pure weighted distillation)
  nor for a lone sample.

  With τ = 1 the softmax concentrates fast: on short responses one token at the −20 floor
  moves a row's mean ℓᵀ by (−20 − ℓ)/L nats, so one failed row can take nearly all of its
  group's distillation weight, up to the path's size n under "code" normalisation, and its
  floored gaps then enter the update about n-fold. A larger `temperature`, a higher
  `teacher_floor` or `normalization="paper"` (weights ≤ 1) keep the per-row scale bounded.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group of each row; unused (may be None) when `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour) log-prob of the sampled token, ℓˢ.
    logprob_teacher: [B,T] float teacher log-prob of the same token, ℓᵀ.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast path).
    mle_coef: λ_mle, weight of the correct path (1.0; the code has none).
    temperature: τ > 0 of the weights (1.0, the scripts' `scope_tau`).
    success_threshold: a row is correct when reward ≥ this (1.0).
    teacher_floor: lower clamp of ℓᵀ (−20).
    normalization: static, "code" (mean 1 per path) | "paper" (sum 1 per path).
    student_weight: static, "confident" (code as run) | "uncertain" (paper's description).
    distill_kind: static, "k1" (code as run) | "low_var_kl".
    mle_token_scale: static, scale the correct path by N/N_c (code's separate token mean).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`, without gradient.

  >>> import numpy as np
  >>> lp = lambda ppl: [[-float(np.log(p))] for p in ppl]
  >>> w, _ = scope_weights(reward=np.array([1., 1., 0., 0.]), group_id=np.zeros(4, int),
  ...     response_mask=np.ones((4, 1), bool), logprob_old=lp([1.2, 2.0, 1.0, 1.0]),
  ...     logprob_teacher=lp([1.0, 1.0, 1.5, 3.0]), num_groups=1)
  >>> np.round(np.asarray(w, np.float64), 6).tolist()
  [1.25, 0.75, 1.333333, 0.666667]
  """
  check_choice("scope_advantages", "distill_kind", distill_kind, SCOPE_DISTILL_KINDS)
  mask_BT = response_mask_of(response_mask)
  w_B, correct_B = scope_weights(
      reward=reward, group_id=group_id, response_mask=mask_BT, logprob_old=logprob_old,
      logprob_teacher=logprob_teacher, num_groups=num_groups, group_size=group_size,
      success_threshold=success_threshold, temperature=temperature,
      teacher_floor=teacher_floor, normalization=normalization, student_weight=student_weight)
  on_B = ops.group_rows("scope_advantages", reward, group_id, num_groups, group_size,
                        response_mask=mask_BT).valid
  delta_BT = teacher_gap(logprob_teacher, logprob_old, mask_BT, teacher_floor)
  d_BT = _distill_signal(delta_BT, distill_kind)
  mle_B = jnp.asarray(mle_coef, jnp.float32) * w_B
  if mle_token_scale:
    tok_B = jnp.sum(mask_BT, axis=-1, dtype=jnp.float32)
    n_all = jnp.sum(jnp.where(on_B, tok_B, 0.0))
    n_cor = jnp.sum(jnp.where(on_B & correct_B, tok_B, 0.0))
    mle_B = mle_B * n_all / jnp.maximum(n_cor, 1.0)
  adv_BT = jnp.where(correct_B[:, None], mle_B[:, None], w_B[:, None] * d_BT)
  return jax.lax.stop_gradient(jnp.where(mask_BT & on_B[:, None], adv_BT, 0.0))
