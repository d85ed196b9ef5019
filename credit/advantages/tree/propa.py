"""PROPA: MCTS step values as a dense process term on top of GRPO (ProRAG's form)."""
from __future__ import annotations

from typing import Any, Literal

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.tree.prorag import (_step_tokens, check_steps, pooled_zscore,
                                           prorag_outcome)
from credit.contract import ContractError, validate_fields
from credit.ops._cast import as_f32
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["propa_advantages", "log_boost", "validate_propa_inputs"]

_PAPER = ("PROPA: Toward Process-level Optimization in Visual Reasoning via Reinforcement "
          "Learning (arXiv id not given in the seeds); code github.com/YanbeiJiang/PROPA")
VALUE_TRANSFORMS = ("identity", "log_boost")


def log_boost(q: ArrayLike, a: ArrayLike = 10.0) -> Array:
  """log(1 + a·q)/log(1 + a) on q clipped to [0, 1] (PROPA's label transform of Q)."""
  q = jnp.clip(as_f32(q), 0.0, 1.0)
  a = jnp.asarray(a, jnp.float32)
  return jnp.log1p(a * q) / jnp.log1p(a)


@register_estimator(
    "propa", needs=("reward", "step_value", "step_mask", "step_id", "group_id",
                    "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "value_transform"))
def propa_advantages(*, reward: ArrayLike, step_value: ArrayLike, step_mask: ArrayLike,
                     step_id: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                     num_groups: int, group_size: int | None = None, beta: ArrayLike = 0.3,
                     eps: ArrayLike = 1e-4, var_eps: ArrayLike = 1e-8,
                     value_transform: Literal["identity", "log_boost"] = "identity") -> Array:
  """PROPA as specified: GRPO + β · step-weighted group z-score of the MCTS step values.

  Confidence: inferred (`shared/methods/distill_and_structure.md` B9: ProRAG's form with
  MCTS values in place of PRM scores; step-weighted statistics and β = 0.3 are the spec's
  choices).

  Paper: "PROPA: Toward Process-level Optimization in Visual Reasoning via Reinforcement
  Learning" (arXiv id not given in the seeds). With Q_{b,k} = `step_value` (the MCTS Q of
  the step's node, valid where `step_mask`):

  .. math::
    A_o[b] = (r_b − μ_g)/(σ_g + ε)                        (σ unbiased, ε = 1e-4, ProRAG)
    μ^Q_g = mean over the valid steps (b∈g, k) of Q,  σ^Q_g = sqrt(var_pop + 1e-8)
    A[b,t] = (A_o[b] + β (Q_{b,k(t)} − μ^Q_g)/σ^Q_g) · M[b,t]

  Each valid step counts once in μ^Q, σ^Q (σ^Q = 1 for a group with ≤ 1 valid step),
  whatever its length; this is the difference from `prorag_advantages`, which weighs by
  tokens. Groups with fewer than 2 valid rows give 0; tokens outside a valid step get A_o.

  What the authors' code does instead (YanbeiJiang/PROPA, read for this module:
  `*/RL_PRM_*/create_GRPO_train_*.py`, `swift/plugin/orm.py` `custom_grpo`): its GRPO is
  per MCTS node — the group is the node's children (sibling next steps from one prefix),
  each child's reward is log_boost(value/visits) with a = 10 (unvisited children 0), and
  nodes whose labels are all 0, all 1 or span < 0.1 are skipped. That is a sibling-group
  estimator over exact-prefix groups, not an additive term on outcome GRPO; we keep the
  spec's form and offer the code's label transform (`value_transform="log_boost"`).
  Interleaved SFT is a training schedule (loop side).

  Args:
    reward: [B] float outcome rewards.
    step_value: [B,K] float MCTS Q of each step (read where `step_mask`; unvisited nodes
      should be off in `step_mask`).
    step_mask, step_id, group_id, response_mask, num_groups, group_size: as
      `prorag_advantages`.
    beta: β. eps: ε on the outcome std. var_eps: added to the step variance.
    value_transform: static, "identity" or "log_boost" (Q clipped to [0,1], then
      log(1+10Q)/log 11, PROPA's labels).

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  >>> import numpy as np
  >>> a = propa_advantages(reward=np.array([1., 0.]), step_value=np.array([[.9, .2],
  ...     [.5, 0.]]), step_mask=np.array([[1, 1], [1, 0]], bool), step_id=np.array(
  ...     [[0, 0, 1], [0, 0, -1]], np.int32), group_id=np.zeros(2, np.int32),
  ...     response_mask=np.array([[1, 1, 1], [1, 1, 0]], bool), num_groups=1)
  >>> np.round(np.asarray(a, np.float64), 5).tolist()
  [[1.09062, 1.09062, 0.35826], [-0.74188, -0.74188, 0.0]]
  """
  check_choice("propa_advantages", "value_transform", value_transform, VALUE_TRANSFORMS)
  reward_B, gid_B, _, valid_B = ops.group_rows(
      "propa_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  mask_BT, step_BK, sid_BT, _ = _step_tokens(response_mask, step_mask, step_id)
  q_BK = as_f32(step_value)
  chex.assert_equal_shape([q_BK, step_BK])
  q_BK = jnp.where(step_BK, q_BK, 0.0)
  if value_transform == "log_boost":
    q_BK = log_boost(q_BK)
  a_o, big_B = prorag_outcome(reward_B, gid_B, valid_B, num_groups, group_size, eps)
  cell_ok = step_BK & big_B[:, None]
  z_BK = pooled_zscore(q_BK, cell_ok, gid_B, num_groups, group_size, var_eps)
  adv = a_o[:, None] + jnp.asarray(beta, jnp.float32) * ops.turn_broadcast(z_BK, sid_BT)
  return jnp.where(mask_BT & big_B[:, None], adv, 0.0)


def validate_propa_inputs(*, num_groups: int | None = None, **fields: Any) -> None:
  """Eager checks before tracing: contract shapes/dtypes, finite rewards, a non-empty
  `response_mask`, `step_id` < K, and finite `step_value` where `step_mask`."""
  validate_fields(fields, num_groups=num_groups, where="propa")
  check_steps("propa", fields)
  q = np.asarray(fields["step_value"])[np.asarray(fields["step_mask"]).astype(bool)]
  if not np.all(np.isfinite(q)):
    raise ContractError("propa: `step_value` contains NaN/inf values under `step_mask`")
