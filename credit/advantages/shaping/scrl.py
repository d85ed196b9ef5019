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

_PAPER = ("SCRL: From Reasoning Chains to Verifiable Subproblems (subproblem curriculum RL), "
          "arXiv preprint")
_FILLS = ("next", "zero")
_INT32_KEYS = 2**31  # the fill keys pos·J + span must stay below this


@register_estimator("scrl", needs=("sub_rewards", "sub_mask", "span_id", "group_id",
                                   "response_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "fill", "singleton"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def scrl_advantages(*, sub_rewards: ArrayLike, sub_mask: ArrayLike, span_id: ArrayLike,
                    group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                    group_size: int | None = None, eps: float = 1e-6,
                    fill: Literal["next", "zero"] = "next",
                    singleton: Literal["zero", "raw"] = "zero") -> Array:
  """SCRL: z-score each subproblem's reward within the group; credit it to its answer span.

  A problem is decomposed into verifiable subproblems whose answers appear as spans of the
  response; each subproblem's reward is normalised across the group's rows that answered
  it::

    a_{i,j} = (r_{i,j} − μ_{g,j}) / (σ_{g,j} + ε)     over {i ∈ g : sub_mask_{i,j}}
    A[i,t]  = a_{i, span_id[i,t]}                    on answer-span tokens
    A[i,t]  = fill                                    on the other response tokens

  With `fill="next"` (default) the reasoning before answer j shares answer j's credit and
  tokens after the last span take the last span's; `fill="zero"` trains the answer spans
  only. An entry outside `sub_mask` takes no part and gets 0 (to count an unanswered
  subproblem as a failure, put 0 in `sub_rewards` and keep it in `sub_mask`).

  Paper: "From Reasoning Chains to Verifiable Subproblems" (SCRL, arXiv preprint). The
  abstract describes subproblem-level rewards; the per-(group, subproblem) z-score and the
  span credit are this library's reading of it.

  Args:
    sub_rewards: [B,J] float verifier result per subproblem answer.
    sub_mask: [B,J] bool valid entries of `sub_rewards`.
    span_id: [B,T] int answer span j holding token t, −1 outside answer spans.
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    eps: added to σ.
    fill: static "next" | "zero".
    singleton: static "zero" | "raw", for a (group, subproblem) with one answer.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = scrl_advantages(
    ...     sub_rewards=np.array([[1., 1], [0, 1], [1, 0]]), sub_mask=np.ones((3, 2), bool),
    ...     span_id=np.array([[-1, 0, -1, 1]] * 3, np.int32), group_id=np.zeros(3, np.int32),
    ...     response_mask=np.ones((3, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.5773, 0.5773, 0.5773, 0.5773], [-1.1547, -1.1547, 0.5773, 0.5773], [0.5773, 0.5773, -1.1547, -1.1547]]
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
  if (T + 1) * num_sub >= _INT32_KEYS:  # keys pos·J + span would overflow: fill from [B,T]
    nxt_BT = jax.lax.cummin(jnp.where(span_BT, pos_T[None, :], T), axis=1, reverse=True)
    last_B = jnp.max(jnp.where(span_BT, pos_T[None, :], -1), axis=1)
    src_BT = jnp.where(nxt_BT < T, nxt_BT, last_B[:, None])
    filled_BT = jnp.take_along_axis(on_span_BT, jnp.clip(src_BT, 0, T - 1), axis=1)
    return jnp.where(mask_BT & (src_BT >= 0), filled_BT, 0.0)
  # The span of the next span token at or after t, else of the row's last span token: one
  # key pos·J + span per span token, so a reverse cummin (and a max) find the position and
  # its span together and the fill gathers from the [B,J] table, not from a [B,T] array.
  key_BT = pos_T[None, :] * num_sub + jnp.clip(sid_BT, 0, num_sub - 1)
  none = T * num_sub
  nxt_BT = jax.lax.cummin(jnp.where(span_BT, key_BT, none), axis=1, reverse=True)
  last_B = jnp.max(jnp.where(span_BT, key_BT, -1), axis=1)
  src_BT = jnp.where(nxt_BT < none, nxt_BT, last_B[:, None])
  return ops.turn_broadcast(adv_BJ, jnp.where(src_BT >= 0, src_BT % num_sub, -1), mask_BT)
