"""HyperEyes: GRPO plus on-policy distillation on failed rollouts (the micro level of its
dual-grained efficiency-aware RL)."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.advantages.distill._teach import TEACHER_FLOOR, grpo_rows, teacher_gap
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["hypereyes_advantages"]

_PAPER = ("HyperEyes: Dual-Grained Efficiency-Aware Reinforcement Learning for Parallel "
          "Multimodal Search Agents, arXiv 2605.07177")

_FORMS = ("code", "paper")
_DEFAULT_COEF = {"code": 0.05, "paper": 1.0}


@register_estimator(
    "hypereyes", needs=("reward", "group_id", "response_mask", "logprob_old",
                        "logprob_teacher"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "form"))
def hypereyes_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                         response_mask: ArrayLike, logprob_old: ArrayLike,
                         logprob_teacher: ArrayLike, num_groups: int,
                         group_size: int | None = None,
                         form: Literal["code", "paper"] = "code",
                         kl_coef: ArrayLike | None = None, fail_threshold: ArrayLike = 0.0,
                         success_threshold: ArrayLike = 1.0,
                         anomaly_threshold: ArrayLike = -99.0, eps: ArrayLike = 1e-6,
                         teacher_floor: ArrayLike = TEACHER_FLOOR) -> Array:
  """HyperEyes OPD: GRPO, then a dense teacher correction on the failed rollouts only.

  Confidence: code-verified (DeepExperience/HyperEyes, `RL/relax-hypereyes`: group
  normalisation `Relax/relax/utils/utils.py::post_process_rewards`; the OPD term
  `Relax/relax/backends/megatron/loss.py::apply_opd_kl_to_advantages`, branch
  "reverse_kl"; the branch assignment `examples/HyperEyes/HyperEyes_reward_V1_2_w_dynamic_
  w_OPD_v0.py` (`acc <= 0` → "reverse_kl", else "skip"); `--opd-kl-coef 0.05` in
  `examples/HyperEyes/HyperEyes_RL.sh`). Spec `distill_and_structure.md` A14 and its
  "Corrections from the authors' code".

  form="code" (default, the released code):

  .. math::
    valid_b = (row non-empty) ∧ R_b > −99            (−99: the code's anomaly marker)
    Â_b = (R_b − μ_g)/(σ_g + 10⁻⁶),   σ² = Σ_{valid}(R − μ)² / max(n_g − 1, 1)
    A_{b,t} = Â_b − β·[R_b ≤ 0]·(ℓˢ_{b,t} − \\max(ℓᵀ_{b,t}, −20)),      β = 0.05

  with μ, σ over the valid rows of the group and Â = 0 in groups with ≤ 1 valid row; an
  anomaly row (R ≤ −99) is loss-masked in the code: it gets exactly 0 (no GRPO, no OPD).
  The OPD term is applied after the normalisation. form="paper" (the paper's form, spec
  A14): the teacher term gates on failure c_b = [R_b ≥ τ_c] instead and uses λ = 1:
  A = Â_b + λ(1 − c_b)(ℓᵀ − ℓˢ) (the same as DiffGate with d_g ≡ 1 and no tanh).

  Notes. The code gates on the accuracy part of its reward (`acc <= 0`, parse failures
  included) while the GRPO term uses the full score (accuracy + TRACE tool-efficiency
  bonus); here both read `reward`, so pass the accuracy, or the TRACE-shaped reward whose
  failures stay ≤ 0. TRACE (the trajectory-level tool-cost reward with a monotonically
  tightened reference n_ref, carried by the loop as state) is a reward transform and is
  not built here. The −20 clamp of ℓᵀ is ours (the code does not clamp; a teacher
  log-prob of −inf would give an infinite advantage there). The teacher term is not zero
  in equal-reward groups of failures or on a failed lone sample.

  Args:
    reward: [B] float outcome rewards (the code's anomaly marker −100 allowed).
    group_id: [B] int group of each row; unused (may be None) when `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour) log-prob of the sampled token, ℓˢ.
    logprob_teacher: [B,T] float teacher log-prob of the same token, ℓᵀ.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast path).
    form: static, "code" | "paper".
    kl_coef: β of the teacher term; None: 0.05 (form="code") or 1.0 (form="paper").
    fail_threshold: form="code": the teacher term applies where reward ≤ this (0.0).
    success_threshold: form="paper": a row is correct where reward ≥ this (1.0).
    anomaly_threshold: rows with reward ≤ this are anomalies (−99.0).
    eps: added to the group std.
    teacher_floor: lower clamp of ℓᵀ (−20).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`, without gradient.

  >>> import numpy as np
  >>> a = hypereyes_advantages(reward=np.array([1., 0., 0., 0.]), group_id=np.zeros(4, int),
  ...     response_mask=np.ones((4, 2), bool), logprob_old=np.zeros((4, 2)),
  ...     logprob_teacher=np.array([[0., 0.], [0.5, -2.0], [0., 0.], [0., 0.]]),
  ...     num_groups=1, form="paper")
  >>> np.round(np.asarray(a[1], np.float64), 6).tolist()
  [1e-06, -2.499999]
  """
  check_choice("hypereyes_advantages", "form", form, _FORMS)
  reward_B = jnp.asarray(reward, jnp.float32)
  ok_B = ~(reward_B <= jnp.asarray(anomaly_threshold, jnp.float32))
  g = grpo_rows("hypereyes_advantages", reward_B, group_id, response_mask, num_groups,
                group_size, eps=eps, valid=ok_B)
  rows, mask_BT = g.rows, g.rows.mask
  if form == "code":
    fail_B = rows.values <= jnp.asarray(fail_threshold, jnp.float32)
  else:
    fail_B = ~(rows.values >= jnp.asarray(success_threshold, jnp.float32))
  beta = jnp.asarray(_DEFAULT_COEF[form] if kl_coef is None else kl_coef, jnp.float32)
  delta_BT = teacher_gap(logprob_teacher, logprob_old, mask_BT, teacher_floor)
  adv_BT = g.adv[:, None] + beta * (rows.valid & fail_B)[:, None] * delta_BT
  return jax.lax.stop_gradient(jnp.where(mask_BT & rows.valid[:, None], adv_BT, 0.0))
