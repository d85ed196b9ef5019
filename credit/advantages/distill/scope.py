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
    normalization: static, "code" | "paper".
    student_weight: static, "confident" | "uncertain".

  The other arguments (`reward`, `group_id`, `response_mask`, `logprob_old`,
  `logprob_teacher`, `num_groups`, `group_size`, `success_threshold`, `temperature`,
  `teacher_floor`) are as in `scope_advantages`.

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
  distillation signal, weighted by how confident the teacher is on it; a correct one gets
  maximum likelihood, weighted by a student-confidence score; both weights are normalised
  inside each (prompt group, path) by `scope_weights`::

    A[b,t] = w_b · d[b,t]                    if c_b = 0
    A[b,t] = λ_mle · w_b · N / N_c           if c_b = 1
    d = δ ("k1"),   d = −clip(e^δ − δ − 1, −10, 10) ("low_var_kl"),   δ = max(ℓᵀ, −20) − ℓˢ

  with N the batch's valid tokens and N_c those of its correct rows (`mle_token_scale`:
  one on-policy update then has the gradient of the code's separate weighted SFT term). Not
  zero in equal-reward groups nor for a lone sample. The output carries no gradient.

  Paper: "SCOPE: Signal-Calibrated On-Policy Distillation Enhancement with Dual-Path
  Adaptive Weighting", arXiv 2604.10688. Defaults follow the authors' released scripts:
  `student_weight="confident"` weights correct rows by the student's confidence (the code's
  sign; "uncertain" is the paper's description) and `normalization="code"` gives each path
  mean weight 1 ("paper": sum 1). Differences: correct means R ≥ τ_c (the code: R > 0);
  ℓᵀ is floored at −20. With τ = 1 on short responses the weights can concentrate on one
  row (see the method's page); a larger `temperature`, a higher `teacher_floor` or
  `normalization="paper"` bound them.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour) log-prob of the sampled token, ℓˢ.
    logprob_teacher: [B,T] float teacher log-prob of the same token, ℓᵀ.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    mle_coef: λ_mle, weight of the correct path.
    temperature: τ > 0 of the weights.
    success_threshold: a row is correct when reward ≥ this.
    teacher_floor: lower clamp of ℓᵀ.
    normalization: static, "code" | "paper".
    student_weight: static, "confident" | "uncertain".
    distill_kind: static, "k1" | "low_var_kl".
    mle_token_scale: static, scale the correct path by N/N_c.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
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
