"""TRACE: log-ratio state values of the gold answer at turn boundaries, TD turn rewards."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.ops._cast import as_f32
from credit.ops.turns import (previous_valid, turn_broadcast, turn_layout, turn_normalize,
                               turn_returns)
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["trace_advantages"]

_PAPER = ("TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents, "
          "arXiv preprint")


@register_estimator(
    "trace", needs=("reward", "gold_logprob_turns", "gold_logprob_prompt", "step_mask",
                    "turn_id", "group_id", "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "normalize"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def trace_advantages(*, reward: ArrayLike, gold_logprob_turns: ArrayLike,
                     gold_logprob_prompt: ArrayLike, step_mask: ArrayLike, turn_id: ArrayLike,
                     group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                     gamma: ArrayLike = 1.0, outcome_coef: ArrayLike = 1.0,
                     floor: float = -50.0, normalize: bool = True, eps: float = 1e-6,
                     var_eps: float = 1e-8) -> Array:
  """TRACE turn advantage: one-step TD change of a log-ratio value, the outcome on the last turn.

  A turn's value is how much more likely the gold answer has become since the prompt,
  scored by a frozen reference model::

    V_k = g_k − g_0,   r_k = γ V_k − V_{k−1}  (k = 1..K_b, V_0 = 0),   r_{K_b} += c_o R
    r̂ = the group z-score of r (population σ, sqrt(σ² + 1e-8) + 1e-6)
    A[b,k] = Σ_{k' ≥ k} γ^{k'−k} r̂[b,k']

  with g_k the gold answer's mean per-token log-prob after turn k (`gold_logprob_turns`;
  g_0 `gold_logprob_prompt`), clipped below at `floor`. With γ = 1 the turn rewards
  telescope. Missing turns are skipped; a one-cell pool gives 0. The runner fills the gold
  fields from the reference for TRACE (`gold_scorer=auto`). A task with no unique answer
  text gives this method nothing to measure progress by.

  Paper: "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon
  Agents" (arXiv preprint). The abstract describes the log-ratio values; the formulas and
  c_o = 1 are this library's reading.

  Args:
    reward: [B] outcome.
    gold_logprob_turns: [B,K] g_1..g_K.
    gold_logprob_prompt: [B] g_0.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    gamma: TD and accumulation discount.
    outcome_coef: c_o.
    floor: lower clip of g.
    normalize: static; False skips the group z-score.
    eps: added to σ.
    var_eps: added to the variance.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask` and outside turns.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 1, 2]], np.int32)
    >>> a = trace_advantages(reward=np.zeros(1), gold_logprob_turns=np.array([[-2., -2.5, -.5]]),
    ...                      gold_logprob_prompt=np.array([-3.]), step_mask=tid >= 0, turn_id=tid,
    ...                      group_id=np.zeros(1, np.int32), response_mask=tid >= 0, num_groups=1,
    ...                      normalize=False)
    >>> np.asarray(a, np.float64).tolist()   # r = [1, -0.5, 2]
    [[2.5, 1.5, 2.0]]
  """
  mask_BT, _, valid, last, tid = turn_layout(response_mask, step_mask, turn_id)
  # V_k = g_k − g_0 (log_prob_diff against the prompt, floored), V_0 = 0.
  zero_B = jnp.zeros(valid.shape[0], jnp.float32)
  g_BK = jnp.maximum(jnp.where(valid, as_f32(gold_logprob_turns), 0.0), floor)
  g0_B = jnp.maximum(jnp.where(jnp.any(valid, 1), as_f32(gold_logprob_prompt), 0.0), floor)
  v_BK = jnp.where(valid, g_BK - g0_B[:, None], 0.0)
  r_BK = gamma * v_BK - previous_valid(v_BK, valid, zero_B)
  r_BK = r_BK + jnp.where(last, outcome_coef * as_f32(reward)[:, None], 0.0)
  r_BK = jnp.where(valid, r_BK, 0.0)
  if normalize:
    r_BK = turn_normalize(r_BK, valid, group_id, num_groups, by="pooled", ddof=0, eps=eps,
                          var_eps=var_eps)
  return turn_broadcast(turn_returns(r_BK, valid, gamma), tid, mask_BT)

