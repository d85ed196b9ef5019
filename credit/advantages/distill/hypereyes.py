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
    paper=_PAPER, static_argnames=("num_groups", "group_size", "form"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: DeepExperience/HyperEyes RL/relax-hypereyes "
                            "(Relax/relax/utils/utils.py post_process_rewards, "
                            "Relax/relax/backends/megatron/loss.py apply_opd_kl_to_advantages, "
                            "examples/HyperEyes/HyperEyes_RL.sh)"))
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

  The micro level of HyperEyes' dual-grained RL: a failed rollout's tokens are pulled
  toward a teacher. `form="code"` (default, the released code)::

    valid_b = (row non-empty) and R_b > −99                  (−99: an anomaly marker)
    Â_b = (R_b − μ_g) / (σ_g + 1e-6)                           (unbiased σ over valid rows)
    A[b,t] = Â_b − β · [R_b ≤ 0] · (ℓˢ[b,t] − max(ℓᵀ[b,t], −20)),     β = 0.05

  Anomaly rows get exactly 0. `form="paper"` gates on failure c_b = [R_b ≥ τ_c] and uses
  λ = 1: A = Â_b + λ (1 − c_b)(ℓᵀ − ℓˢ). The teacher term is not zero in all-failed groups
  or on a failed lone sample. The output carries no gradient.

  Paper: "HyperEyes: Dual-Grained Efficiency-Aware Reinforcement Learning for Parallel
  Multimodal Search Agents", arXiv 2605.07177. Differences from the code: it gates on the
  accuracy part of its reward while its GRPO term reads the whole score; here both read
  `reward`. The −20 clamp of ℓᵀ is this library's (an infinite gap otherwise). The
  tool-cost reward (TRACE) is the separate estimator `trace_cost`.

  Args:
    reward: [B] float outcome rewards (the anomaly marker −100 allowed).
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student (behaviour) log-prob of the sampled token, ℓˢ.
    logprob_teacher: [B,T] float teacher log-prob of the same token, ℓᵀ.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    form: static, "code" | "paper".
    kl_coef: β of the teacher term; None: 0.05 ("code") or 1.0 ("paper").
    fail_threshold: "code": the teacher term applies where reward ≤ this.
    success_threshold: "paper": a row is correct where reward ≥ this.
    anomaly_threshold: rows with reward ≤ this are anomalies.
    eps: added to the group std.
    teacher_floor: lower clamp of ℓᵀ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
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
