"""PBSD: per-turn Bayesian evidence from an answer-conditioned self-teacher, added to GRPO."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.advantages.distill._steps import clean_logprobs, grpo_rows
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["pbsd_advantages", "pbsd_turn_evidence"]

_PAPER = ("PBSD: Privileged Bayesian Self-Distillation for Long-Horizon Credit Assignment, "
          "arXiv:2606.09348")

MODES = ("additive", "multiplicative")


def pbsd_turn_evidence(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                       logprob_teacher: ArrayLike, turn_id: ArrayLike,
                       num_turns: int) -> Array:
  """Per-turn log-evidence e[b,k] = Σ_{t ∈ turn k, action} (ℓᵀ_t − ℓˢ_t), [B,K] float32.

  Observation tokens are excluded through `response_mask`; tokens with `turn_id` outside
  [0, K) count for no turn; a turn without an action token has e = 0.

  Example:
    >>> import numpy as np
    >>> e = pbsd_turn_evidence(response_mask=np.array([[1, 1, 1, 0, 1]], bool),
    ...     logprob_old=np.array([[-0.7, -0.9, -0.6, -0.3, -1.0]]),
    ...     logprob_teacher=np.array([[-0.5, -1.0, -0.2, -0.3, -2.0]]),
    ...     turn_id=np.array([[0, 0, 1, 1, 2]], np.int32), num_turns=3)
    >>> np.round(np.asarray(e, np.float64), 6).tolist()
    [[0.1, 0.4, -1.0]]
  """
  check_int("pbsd_turn_evidence", "num_turns", num_turns)
  mask_BT, ls_BT, lt_BT = clean_logprobs(response_mask, logprob_old, logprob_teacher)
  tid_BT = jnp.asarray(turn_id)
  chex.assert_type(tid_BT, int)
  chex.assert_equal_shape([tid_BT, mask_BT])
  e_BK = ops.turn_reduce(lt_BT - ls_BT, tid_BT, num_turns, mask_BT, reduce="sum")
  return jax.lax.stop_gradient(e_BK)


@register_estimator(
    "pbsd", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher",
                   "turn_id", "step_mask"),
    paper=_PAPER, static_argnames=("num_groups", "mode", "ddof", "group_std"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def pbsd_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    logprob_old: ArrayLike, logprob_teacher: ArrayLike, turn_id: ArrayLike,
                    step_mask: ArrayLike, num_groups: int, lam: ArrayLike = 0.5,
                    mode: Literal["additive", "multiplicative"] = "additive", ddof: int = 0,
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """PBSD: GRPO plus the group-normalised log-evidence of each agent turn.

  A trajectory is scored by how much it raises the probability of the verified answer a*;
  by Bayes' rule p(a*|x,τ)/p(a*|x) = p(τ|x,a*)/p(τ|x), a likelihood ratio of the trajectory
  under the answer-conditioned policy (the privileged self-teacher, ℓᵀ) and the plain
  policy (ℓˢ). Observation tokens cancel, so the log-evidence splits over the agent's
  turns::

    e[b,k] = Σ_{t ∈ turn k, action} (ℓᵀ_t − ℓˢ_t)                    (`pbsd_turn_evidence`)
    ẽ[b,k] = (e[b,k] − μ_g) / (σ_g + ε)        (pooled over every valid turn of group g)
    additive:        A[b,t] = Â_b + λ ẽ[b,k(t)]
    multiplicative:  A[b,t] = Â_b (1 + λ tanh ẽ[b,k(t)])

  A pool with fewer than two turns gives ẽ = 0; tokens outside every turn get Â_b alone.
  The output carries no gradient.

  Paper: "PBSD: Privileged Bayesian Self-Distillation for Long-Horizon Credit Assignment",
  arXiv 2606.09348. The paper gives the evidence; how it enters the advantage (the two
  modes, λ = 0.5, the pooled population std) is this library's.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int prompt group of each row in [0, num_groups).
    response_mask: [B,T] bool, the agent's action tokens (observations masked).
    logprob_old: [B,T] float student log-prob of the sampled token.
    logprob_teacher: [B,T] float answer-conditioned (privileged) log-prob of it.
    turn_id: [B,T] int agent turn of each token, −1 outside turns.
    step_mask: [B,K] bool, the turns each row took (K is its static width).
    num_groups: static number of groups.
    lam: λ.
    mode: static, "additive" | "multiplicative".
    ddof: static, 0 (population) or 1 (unbiased) std of the turn pool.
    group_std: static, "unbiased" | "population" | "none" (GRPO's σ).
    eps: added to both stds.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = pbsd_advantages(reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
    ...     response_mask=np.array([[1, 1, 1, 0, 1]] * 2, bool),
    ...     logprob_old=np.array([[-0.7, -0.9, -0.6, -0.3, -1.0]] * 2),
    ...     logprob_teacher=np.array([[-0.5, -1.0, -0.2, -0.3, -2.0],
    ...                               [-0.7, -0.9, -0.6, -0.3, -1.0]]),
    ...     turn_id=np.array([[0, 0, 1, 1, 2]] * 2, np.int32),
    ...     step_mask=np.ones((2, 3), bool), num_groups=1, group_std="none")
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.7114, 0.7114, 1.0573, 0.0, -0.5569], [-0.4039, -0.4039, -0.4039, 0.0, -0.4039]]
  """
  check_choice("pbsd_advantages", "mode", mode, MODES)
  check_choice("pbsd_advantages", "ddof", ddof, (0, 1))
  rows, adv_B = grpo_rows("pbsd_advantages", reward, group_id, response_mask, num_groups,
                          None, group_std, eps)
  mask_BT, _, valid_BK, _, tid_BT = ops.turn_layout(rows.mask, step_mask, turn_id)
  valid_BK = valid_BK & rows.valid[:, None]
  e_BK = pbsd_turn_evidence(response_mask=mask_BT, logprob_old=logprob_old,
                            logprob_teacher=logprob_teacher, turn_id=tid_BT,
                            num_turns=valid_BK.shape[1])
  e_BK = ops.turn_normalize(e_BK, valid_BK, rows.group_id, num_groups, by="pooled", ddof=ddof,
                            eps=eps)
  e_BT = ops.turn_broadcast(e_BK, tid_BT, mask_BT)
  lam = jnp.asarray(lam, jnp.float32)
  if mode == "additive":
    out_BT = adv_B[:, None] + lam * e_BT
  else:
    out_BT = adv_B[:, None] * (1.0 + lam * jnp.tanh(e_BT))
  return jax.lax.stop_gradient(jnp.where(mask_BT, out_BT, 0.0))
