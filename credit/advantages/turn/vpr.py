"""VPR: oracle-verified turn rewards, discounted turn returns normalised per turn index."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops._cast import as_f32
from credit.ops.turns import turn_broadcast, turn_layout, turn_normalize, turn_returns
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["vpr_advantages"]

_PAPER = "Verifiable Process Rewards for Agentic Reasoning (VPR); arXiv id not given in the seeds"


@register_estimator(
    "vpr", needs=("reward", "step_reward", "step_mask", "turn_id", "group_id", "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "turn_norm"))
def vpr_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                   turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                   num_groups: int, gamma: ArrayLike = 1.0, reliability: ArrayLike = 1.0,
                   turn_norm: Literal["index", "pooled"] = "index",
                   eps: float = 1e-6) -> Array:
  """VPR: return of the oracle's turn verdicts plus the outcome, z-scored per turn index.

  Confidence: inferred (from the abstract; formulas of the spec
  `shared/methods/distill_and_structure.md` B11, γ = 1 and ω = 1 ours).

  Paper: "Verifiable Process Rewards for Agentic Reasoning" (arXiv id not given in the
  seeds).

  .. math::
    G_{b,k} = Σ_{j ≥ k} γ^{j−k} ω v_{b,j} + γ^{K_b − k} R_b
    A_{b,k} = (G_{b,k} − μ_{g,k}) / (σ_{g,k} + 1e-6)   (population σ over the rollouts of
                                                     group g having turn k; < 2 → 0)

  v = `step_reward` (the oracle's verdict on each turn, {0,1} or [−1,1]); ω the oracle's
  reliability weight. `turn_norm="pooled"` normalises over all turns of the group (for turn
  indices misaligned across rollouts). Exponents count valid turns (skipped turns neither
  add nor discount).

  Args:
    reward: [B] outcome R. step_reward: [B,K] verdicts v.
    step_mask, turn_id, group_id, response_mask, num_groups: as `igpo_advantages`.
    gamma: γ. reliability: ω. turn_norm: static "index" | "pooled". eps: added to σ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask` and outside turns.
  """
  check_choice("vpr_advantages", "turn_norm", turn_norm, ("index", "pooled"))
  mask_BT, _, valid, last, tid = turn_layout(response_mask, step_mask, turn_id)
  v = jnp.where(valid, reliability * as_f32(step_reward), 0.0)
  x = v + jnp.where(last, as_f32(reward)[:, None], 0.0)
  g_BK = turn_returns(x, valid, gamma)
  a_BK = turn_normalize(g_BK, valid, group_id, num_groups, by=turn_norm, ddof=0, eps=eps)
  return turn_broadcast(a_BK, tid, mask_BT)
