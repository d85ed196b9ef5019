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

_PAPER = "Verifiable Process Rewards for Agentic Reasoning (VPR), arXiv preprint"


@register_estimator(
    "vpr", needs=("reward", "step_reward", "step_mask", "turn_id", "group_id", "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "turn_norm"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def vpr_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                   turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                   num_groups: int, gamma: ArrayLike = 1.0, reliability: ArrayLike = 1.0,
                   turn_norm: Literal["index", "pooled"] = "index",
                   eps: float = 1e-6) -> Array:
  """VPR: return of the oracle's turn verdicts plus the outcome, z-scored per turn index.

  ::

    G[b,k] = Σ_{j ≥ k} γ^{j−k} ω v[b,j] + γ^{K_b − k} R_b
    A[b,k] = (G[b,k] − μ_{g,k}) / (σ_{g,k} + 1e-6)   (rollouts of group g having turn k)

  with v = `step_reward` the oracle's verdict on each turn and ω its reliability weight;
  population σ, fewer than two members give 0. `turn_norm="pooled"` normalises over all
  turns of the group (for turn indices misaligned across rollouts). Exponents count valid
  turns.

  Paper: "Verifiable Process Rewards for Agentic Reasoning" (VPR, arXiv preprint). The
  formula and γ = ω = 1 are this library's reading of the abstract.

  Args:
    reward: [B] outcome R.
    step_reward: [B,K] verdicts v.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    gamma: γ.
    reliability: ω.
    turn_norm: static "index" | "pooled".
    eps: added to σ.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask` and outside turns.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = vpr_advantages(reward=np.array([1., 0.]), step_reward=np.array([[1., 1.],
    ...     [1., 0.]]), step_mask=np.ones((2, 2), bool), turn_id=tid,
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]]
  """
  check_choice("vpr_advantages", "turn_norm", turn_norm, ("index", "pooled"))
  mask_BT, _, valid, last, tid = turn_layout(response_mask, step_mask, turn_id)
  v = jnp.where(valid, reliability * as_f32(step_reward), 0.0)
  x = v + jnp.where(last, as_f32(reward)[:, None], 0.0)
  g_BK = turn_returns(x, valid, gamma)
  a_BK = turn_normalize(g_BK, valid, group_id, num_groups, by=turn_norm, ddof=0, eps=eps)
  return turn_broadcast(a_BK, tid, mask_BT)
