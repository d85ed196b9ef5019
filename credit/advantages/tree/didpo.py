"""DiDPO: group-relative advantages within diff anchors (clusters of near-identical sub-diffs)."""
from __future__ import annotations

from typing import Any, Literal

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.contract import ContractError, validate_fields
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["didpo_advantages", "anchor_members", "validate_didpo_inputs"]

_PAPER = "DiDPO: Diff-in-Diff Policy Optimization for Coding Agent Training, arXiv preprint"
_NONE = jnp.iinfo(jnp.int32).max  # sort key of tokens without an anchor


def anchor_members(anchor_id: ArrayLike, response_mask: ArrayLike, same_group_BB: Array
                   ) -> Array:
  """[B,T,B] bool: row b' holds a valid token of the anchor of token (b,t), in b's group.

  Row b' is a member once however many of its tokens carry the anchor (deduplication).
  Membership is found by a binary search of each token's anchor in every row's sorted
  anchor ids: O(B² T log T) work and O(B² T) memory, no static number of anchors.
  """
  anc_BT = jnp.asarray(anchor_id, jnp.int32)
  mask_BT = jnp.asarray(response_mask).astype(bool)
  ok_BT = mask_BT & (anc_BT >= 0)
  key_BT = jnp.where(ok_BT, anc_BT, _NONE)
  B, T = key_BT.shape
  sorted_BT = jnp.sort(key_BT, axis=1)
  queries = key_BT.reshape(-1)
  pos = jax.vmap(lambda row: jnp.searchsorted(row, queries))(sorted_BT)       # [B', B·T]
  found = jnp.take_along_axis(sorted_BT, jnp.clip(pos, 0, T - 1), axis=1) == queries[None, :]
  has = found.T.reshape(B, T, B)
  return has & ok_BT[:, :, None] & same_group_BB[:, None, :]


def _anchor_moments(anc_BT: Array, mask_BT: Array, gid_B: Array, r_B: Array
                    ) -> tuple[Array, Array, Array]:
  """Per token (b,t): the number n of rows of b's group holding a valid token of its anchor
  (each row once), their reward mean and unbiased variance ([B,T] each; n = 0 for tokens
  without an anchor). The same numbers as `anchor_members` summed over its last axis, from
  one sort of the valid tokens by (group, anchor, row): O(B·T log(B·T)) work, O(B·T) memory.
  """
  B, T = anc_BT.shape
  ok_BT = mask_BT & (anc_BT >= 0)
  g_M = jnp.where(ok_BT, gid_B[:, None], _NONE).reshape(-1)   # invalid tokens sort last
  a_M = jnp.where(ok_BT, anc_BT, _NONE).reshape(-1)
  row_M = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, T)).reshape(-1)
  idx_M = jnp.arange(B * T, dtype=jnp.int32)
  g_S, a_S, row_S, idx_S = jax.lax.sort((g_M, a_M, row_M, idx_M), num_keys=3)
  ok_S = ok_BT.reshape(-1)[idx_S]
  new_key = jnp.concatenate([jnp.ones(1, bool), (g_S[1:] != g_S[:-1]) | (a_S[1:] != a_S[:-1])])
  first_row = new_key | jnp.concatenate([jnp.ones(1, bool), row_S[1:] != row_S[:-1]])
  seg_S = jnp.cumsum(new_key.astype(jnp.int32)) - 1             # (group, anchor) segment
  one_S = (first_row & ok_S).astype(jnp.float32)                # each member row once
  r_S = r_B[row_S]
  segsum = lambda x: jax.ops.segment_sum(x, seg_S, B * T, indices_are_sorted=True)
  n_K = segsum(one_S)
  mean_K = segsum(one_S * r_S) / jnp.maximum(n_K, 1.0)
  dev_S = jnp.where(one_S > 0, r_S - mean_K[seg_S], 0.0)
  var_K = segsum(dev_S * dev_S) / jnp.maximum(n_K - 1.0, 1.0)
  back = lambda x_K: jnp.zeros(B * T, jnp.float32).at[idx_S].set(
      jnp.where(ok_S, x_K[seg_S], 0.0), unique_indices=True).reshape(B, T)
  return back(n_K), back(mean_K), back(var_K)


@register_estimator(
    "didpo", needs=("anchor_id", "reward", "group_id", "response_mask"), paper=_PAPER,
    static_argnames=("num_groups", "group_size", "min_anchor_size", "singleton"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def didpo_advantages(*, anchor_id: ArrayLike, reward: ArrayLike, group_id: ArrayLike | None,
                     response_mask: ArrayLike, num_groups: int, group_size: int | None = None,
                     eps: ArrayLike = 1e-6, min_anchor_size: int = 2,
                     singleton: Literal["zero", "raw"] = "zero") -> Array:
  """DiDPO: each anchored token gets the z-score of its reward among its anchor's rows.

  A coding agent's diffs are split into sub-diffs; highly similar sub-diffs across a
  prompt group's trajectories form an anchor, every anchor is an advantage group, and its
  advantage goes back to the tokens that wrote the sub-diff. With M_a the rows of the group
  holding a valid token of anchor a (each row once)::

    A_{a,b} = (r_b − mean_{M_a} r) / (std_{M_a} r + ε)        (unbiased std)
    A[b,t] = A_{anchor(b,t), b}   if size(M_a) ≥ 2
    A[b,t] = A_grpo[b]            if the token has no anchor (−1) or size(M_a) < 2

  Anchor ids are local to their prompt group; a token in several anchors must be given
  one (the largest) by the loop. All-equal rewards inside an anchor give exactly 0.

  Paper: "DiDPO: Diff-in-Diff Policy Optimization for Coding Agent Training" (arXiv
  preprint). The diff parsing that forms anchors is the loop's job; the GRPO fallback and
  the minimum anchor size 2 are this library's.

  Args:
    anchor_id: [B,T] int anchor of each token (−1 for none); any non-negative ids.
    reward: [B] float outcome rewards.
    group_id: [B] int prompt group in [0, num_groups); unused when `group_size` is set.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups.
    group_size: static G of the contiguous fast path.
    eps: ε on the std (anchor and GRPO).
    min_anchor_size: static; smaller anchors fall back to GRPO.
    singleton: the GRPO fallback's one-row rule ("zero" | "raw").

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`. O(B·T) memory (one sort).

  Example:
    >>> import numpy as np
    >>> a = didpo_advantages(anchor_id=np.array([[0, -1], [-1, -1], [0, 0]], np.int32),
    ...     reward=np.array([1., 1., 0.]), group_id=np.zeros(3, np.int32),
    ...     response_mask=np.ones((3, 2), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 5).tolist()
    [[0.70711, 0.57735], [0.57735, 0.57735], [-0.70711, -0.70711]]
  """
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "didpo_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  anc_BT = jnp.asarray(anchor_id)
  chex.assert_type(anc_BT, int)
  chex.assert_equal_shape([anc_BT, mask_BT])
  check_int("didpo_advantages", "min_anchor_size", min_anchor_size)
  mask_BT = mask_BT & valid_B[:, None]
  grpo_BT = ops.grpo_token_advantages("didpo_advantages", reward=reward_B, group_id=gid_B,
                                      response_mask=mask_BT, num_groups=num_groups,
                                      group_size=group_size, eps=eps, singleton=singleton)
  r = jnp.where(valid_B, reward_B, 0.0)
  n_BT, mean_BT, var_BT = _anchor_moments(anc_BT, mask_BT, gid_B, r)
  std_BT = ops.safe_sqrt(var_BT)
  z_BT = (r[:, None] - mean_BT) / (std_BT + jnp.asarray(eps, jnp.float32))
  out = jnp.where(n_BT >= min_anchor_size, z_BT, grpo_BT)
  return jnp.where(mask_BT, out, 0.0)


def validate_didpo_inputs(*, num_groups: int | None = None, **fields: Any) -> None:
  """Eager checks before tracing: contract shapes/dtypes, finite rewards, a non-empty
  `response_mask`, and anchor ids ≥ −1 (below the int32 maximum) on response tokens."""
  validate_fields(fields, num_groups=num_groups, where="didpo")
  anc = np.asarray(fields["anchor_id"])
  m = np.asarray(fields["response_mask"]).astype(bool)
  bad = m & ((anc < -1) | (anc >= np.iinfo(np.int32).max))
  if bad.any():
    raise ContractError(f"didpo: `anchor_id` must be −1 (none) or a non-negative int32 "
                        f"below 2**31−1 on response tokens; {int(bad.sum())} are not")
