"""ProRAG: GRPO outcome advantage plus a group-normalised PRM step score on every token."""
from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit.contract import ContractError, validate_fields
from credit.ops._cast import as_f32
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["prorag_advantages", "prorag_outcome", "pooled_zscore", "validate_prorag_inputs"]

_PAPER = ("ProRAG: Process-Supervised Reinforcement Learning for Retrieval-Augmented "
          "Generation (arXiv id not given in the seeds); code github.com/lilinwz/ProRAG")


def prorag_outcome(reward_B: Array, gid_B: Array, valid_B: Array, num_groups: int,
                   group_size: int | None, eps: ArrayLike) -> tuple[Array, Array]:
  """(A_o [B], row is in a group of >= 2 valid rows [B] bool).

  A_o = (r − μ_g)/(σ_g + eps), σ_g the unbiased (torch `.std()`) group std; rows of smaller
  groups (where the code's torch std is NaN) get 0.
  """
  count_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  a_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, eps=eps,
                            singleton="zero", group_size=group_size)
  big_B = valid_B & (count_B >= 2)
  return jnp.where(big_B, a_B, 0.0), big_B


def pooled_zscore(x_BN: Array, ok_BN: Array, gid_B: Array, num_groups: int,
                  group_size: int | None, var_eps: ArrayLike = 1e-8) -> Array:
  """Z-score of items [B,N] pooled over all valid items of each group's rows.

  .. math::
    μ = Σ_{g,ok} x / n,   σ = sqrt(Σ_{g,ok} (x − μ)² / n + var_eps)   (σ = 1 if n ≤ 1)

  (population variance, `var_eps` inside the root: ProRAG's `trainer.py`). Items are
  tokens (ProRAG, token-weighted) or steps (PROPA, step-weighted). Returns [B,N] float32,
  0 at invalid items. Rows whose group id is out of range must have no valid item.
  """
  ok = ok_BN.astype(bool)
  row_ok_B = jnp.any(ok, axis=1)
  x = jnp.where(ok, as_f32(x_BN), 0.0)
  okf = ok.astype(jnp.float32)
  gsum = lambda v_B: ops.group_reduce_rows(v_B, gid_B, row_ok_B, num_groups, group_size, "sum")
  n_B = gsum(jnp.sum(okf, axis=1))
  # Shift by a per-group pivot (the group max) so large scores keep their differences.
  pivot_B = ops.group_reduce_rows(jnp.max(jnp.where(ok, x, -jnp.inf), axis=1), gid_B, row_ok_B,
                                  num_groups, group_size, "max")
  pivot_B = jnp.where(row_ok_B, pivot_B, 0.0)
  d = jnp.where(ok, x - pivot_B[:, None], 0.0)
  dmean_B = gsum(jnp.sum(d, axis=1)) / jnp.maximum(n_B, 1.0)
  c = jnp.where(ok, d - dmean_B[:, None], 0.0)
  var_B = gsum(jnp.sum(c * c, axis=1)) / jnp.maximum(n_B, 1.0)
  std_B = jnp.where(n_B <= 1.0, 1.0, ops.safe_sqrt(var_B + jnp.asarray(var_eps, jnp.float32)))
  return jnp.where(ok, c / std_B[:, None], 0.0)


def _step_tokens(response_mask, step_mask, step_id) -> tuple[Array, Array, Array, Array]:
  """(mask_BT, step_BK, sid_BT, tok_ok_BT): tokens of a valid step under the mask."""
  mask_BT = jnp.asarray(response_mask)
  step_BK = jnp.asarray(step_mask)
  sid_BT = jnp.asarray(step_id)
  chex.assert_rank([mask_BT, step_BK, sid_BT], 2)
  chex.assert_type(sid_BT, int)
  chex.assert_equal_shape([mask_BT, sid_BT])
  chex.assert_equal_shape_prefix([mask_BT, step_BK], 1)
  mask_BT, step_BK, sid_BT = mask_BT.astype(bool), step_BK.astype(bool), sid_BT.astype(jnp.int32)
  K = step_BK.shape[1]
  in_range = (sid_BT >= 0) & (sid_BT < K)
  step_of_tok = jnp.take_along_axis(step_BK, jnp.clip(sid_BT, 0, K - 1), axis=1)
  return mask_BT, step_BK, sid_BT, mask_BT & in_range & step_of_tok


@register_estimator(
    "prorag", needs=("reward", "step_reward", "step_mask", "step_id", "group_id",
                     "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "group_size"))
def prorag_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                      step_id: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                      num_groups: int, group_size: int | None = None,
                      beta: ArrayLike = 0.3, eps: ArrayLike = 1e-4,
                      var_eps: ArrayLike = 1e-8) -> Array:
  """ProRAG dual-granularity advantage: outcome GRPO + β · token-weighted z-score of PRM scores.

  Confidence: code-verified (lilinwz/ProRAG `prorag/rl/trainer.py` `_generate_and_score`
  advantage block, `prorag/rl/rollout.py` `rag_rollout_with_prm`, `scripts/rl.sh`; read
  for this module), `shared/methods/distill_and_structure.md` B8 + "Corrections".

  Paper: "ProRAG: Process-Supervised Reinforcement Learning for RAG" (arXiv id not given in
  the seeds). With s_{b,k} = `step_reward` (the PRM score of step k: sigmoid of the PRM
  logit plus the step's format reward, computed by the loop) copied onto the tokens of
  step k (`step_id`), and m the tokens of valid steps:

  .. math::
    A_o[b] = (r_b − μ_g) / (σ_g + ε)                     (σ unbiased, ε = 1e-4)
    μ'_g = Σ_{b∈g,t} m s / Σ m,  σ'_g = sqrt(Σ m (s − μ')² / Σ m + 1e-8)  (σ' = 1 if Σ m ≤ 1)
    A[b,t] = (A_o[b] + β (s_{b,k(t)} − μ'_g)/σ'_g) · M[b,t]

  The step statistics are token-weighted (a long step weighs more, as in the code) and
  pooled over the whole prompt group. Defaults: β = 0.3 (the run script; the trainer
  class default is 0.5), G = 8 in the recipe.

  Differences from the code (the "Corrections"): A_o is masked (the code leaves A_o on
  padding); a group with fewer than 2 valid rows gives 0 on all its tokens (the code's
  torch std is NaN there and poisons the whole row). Choices (ours): response tokens
  outside any valid step (step_id −1 or a step off in `step_mask`) get A_o alone and take
  no part in μ', σ' (the code masks retrieved-document tokens the same way); rows with an
  empty response take no part in any statistic.

  Args:
    reward: [B] float outcome rewards.
    step_reward: [B,K] float PRM score of each step (read where `step_mask`).
    step_mask: [B,K] bool, the steps that exist.
    step_id: [B,T] int step of each token (−1 outside steps).
    group_id: [B] int prompt group in [0, num_groups); unused when `group_size` is set.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups. group_size: static G of the contiguous fast path.
    beta: β, weight of the step term. eps: ε on the outcome std. var_eps: added to the
      step variance inside the root.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  >>> import numpy as np
  >>> a = prorag_advantages(reward=np.array([1., 0.]), step_reward=np.array([[.9, .2],
  ...     [.5, 0.]]), step_mask=np.array([[1, 1], [1, 0]], bool), step_id=np.array(
  ...     [[0, 0, 1], [0, 0, -1]], np.int32), group_id=np.zeros(2, np.int32),
  ...     response_mask=np.array([[1, 1, 1], [1, 1, 0]], bool), num_groups=1)
  >>> np.round(np.asarray(a, np.float64), 5).tolist()
  [[1.04242, 1.04242, 0.25979], [-0.81881, -0.81881, 0.0]]
  """
  reward_B, gid_B, _, valid_B = ops.group_rows(
      "prorag_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  mask_BT, _, sid_BT, tok_ok = _step_tokens(response_mask, step_mask, step_id)
  s_BK = as_f32(step_reward)
  chex.assert_equal_shape([s_BK, jnp.asarray(step_mask)])
  a_o, big_B = prorag_outcome(reward_B, gid_B, valid_B, num_groups, group_size, eps)
  tok_ok = tok_ok & big_B[:, None]
  s_BT = ops.turn_broadcast(jnp.where(jnp.asarray(step_mask, bool), s_BK, 0.0), sid_BT, tok_ok)
  z_BT = pooled_zscore(s_BT, tok_ok, gid_B, num_groups, group_size, var_eps)
  adv = a_o[:, None] + jnp.asarray(beta, jnp.float32) * z_BT
  return jnp.where(mask_BT & big_B[:, None], adv, 0.0)


def check_steps(where: str, fields: dict[str, Any]) -> None:
  """Eager checks shared by the step estimators: `step_id` < K on valid tokens."""
  sid = np.asarray(fields["step_id"])
  mask = np.asarray(fields["response_mask"]).astype(bool)
  K = np.asarray(fields["step_mask"]).shape[1]
  bad = mask & (sid >= K)
  if bad.any():
    raise ContractError(f"{where}: `step_id` must be < K={K} (the width of `step_mask`) on "
                        f"response tokens; {int(bad.sum())} token(s) are not")


def validate_prorag_inputs(*, num_groups: int | None = None, **fields: Any) -> None:
  """Eager checks before tracing: contract shapes/dtypes, finite rewards and step scores
  (under `step_mask`), a non-empty `response_mask`, `step_id` < K. Raises ContractError."""
  validate_fields(fields, num_groups=num_groups, where="prorag")
  check_steps("prorag", fields)

