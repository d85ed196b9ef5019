"""SCRL: subproblem-level group normalisation, placed on each subproblem's answer span."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["scrl_advantages"]

_PAPER = ("SCRL: From Reasoning Chains to Verifiable Subproblems (subproblem curriculum RL); "
          "arXiv id not given in the seeds")
_FILLS = ("next", "zero")


@register_estimator("scrl", needs=("sub_rewards", "sub_mask", "span_id", "group_id",
                                   "response_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "fill", "singleton"))
def scrl_advantages(*, sub_rewards: ArrayLike, sub_mask: ArrayLike, span_id: ArrayLike,
                    group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                    group_size: int | None = None, eps: float = 1e-6,
                    fill: Literal["next", "zero"] = "next",
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """SCRL: z-score each subproblem's reward per group; credit it to its answer span.

  Confidence: inferred from abstract (`shared/methods/outcome_and_clipping.md` §9; no code
  found: searched the code and pages corpora for SCRL / "verifiable subproblems" /
  "subproblem curriculum", 2026-12).

  Paper: "From Reasoning Chains to Verifiable Subproblems" (SCRL; arXiv id not given in
  the seeds).

  .. math::
    a_{i,j} = (r_{i,j} − μ_{g,j}) / (σ_{g,j} + ε)     over {i ∈ g : sub_mask_{i,j}}
    A[i,t]  = a_{i, span_id[i,t]}                    on answer-span tokens
    A[i,t]  = fill                                    on the other response tokens

  Statistics are P6 with item (group, subproblem): unbiased σ, ε on σ; a (group,
  subproblem) with one valid answer gives 0 (`singleton="zero"`) or its raw reward
  ("raw"). An entry outside `sub_mask` (a subproblem the prompt does not have, or that
  the rollout left unanswered) takes no part in the statistics and gets 0. To count an
  unanswered subproblem as a failure instead, put 0 in `sub_rewards` and keep it in
  `sub_mask`.

  `fill` (static) credits the response tokens outside every answer span:
    * "next" (default): the advantage of the next answer span in the row, so the reasoning
      that leads to answer j shares answer j's credit; tokens after the row's last span
      (closing text, end of sequence) get the last span's advantage, i.e. that of the
      original problem when the last span answers it; a row with no answer span gets 0;
    * "zero": 0 (only answer spans are trained).
  A span token whose `span_id` is not below J (the number of columns of `sub_rewards`)
  counts as outside every span.

  Args:
    sub_rewards: [B,J] float verifier result r_{i,j} per subproblem answer.
    sub_mask: [B,J] bool valid entries of `sub_rewards`.
    span_id: [B,T] int answer span j holding token t, −1 outside answer spans.
    group_id, response_mask, num_groups, group_size: as `grpo_advantages`.
    eps: added to σ. fill: static "next" | "zero". singleton: static "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.
  """
  fn = "scrl_advantages"
  check_choice(fn, "fill", fill, _FILLS)
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  r_BJ = jnp.asarray(sub_rewards, jnp.float32)
  sm_BJ = jnp.asarray(sub_mask).astype(bool)
  chex.assert_rank([r_BJ, sm_BJ], 2)
  chex.assert_equal_shape([r_BJ, sm_BJ])
  _, gid_B, mask_BT, valid_B = ops.group_rows(fn, r_BJ[:, 0], group_id, num_groups,
                                              group_size, response_mask=response_mask)
  sid_BT = jnp.asarray(span_id)
  chex.assert_type(sid_BT, int)
  chex.assert_equal_shape([sid_BT, mask_BT])
  num_sub = r_BJ.shape[1]
  ok_BJ = sm_BJ & valid_B[:, None]
  r_BJ = jnp.where(ok_BJ, r_BJ, 0.0)
  adv_BJ = jax.vmap(
      lambda r, ok: ops.group_normalize(r, gid_B, num_groups, valid=ok, eps=eps,
                                        singleton=singleton, group_size=group_size),
      in_axes=(1, 1), out_axes=1)(r_BJ, ok_BJ)

  sid_BT = sid_BT.astype(jnp.int32)
  span_BT = mask_BT & (sid_BT >= 0) & (sid_BT < num_sub)
  on_span_BT = jnp.take_along_axis(adv_BJ, jnp.clip(sid_BT, 0, num_sub - 1), axis=1)
  on_span_BT = jnp.where(span_BT, on_span_BT, 0.0)
  if fill == "zero":
    return on_span_BT
  T = mask_BT.shape[1]
  pos_T = jnp.arange(T, dtype=jnp.int32)
  # Next span token at or after t (T when none), and the row's last span token (−1 when none).
  nxt_BT = jax.lax.cummin(jnp.where(span_BT, pos_T[None, :], T), axis=1, reverse=True)
  last_B = jnp.max(jnp.where(span_BT, pos_T[None, :], -1), axis=1)
  src_BT = jnp.where(nxt_BT < T, nxt_BT, last_B[:, None])
  filled_BT = jnp.take_along_axis(on_span_BT, jnp.clip(src_BT, 0, T - 1), axis=1)
  filled_BT = jnp.where(src_BT >= 0, filled_BT, 0.0)
  return jnp.where(mask_BT, filled_BT, 0.0)
