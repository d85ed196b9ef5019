"""Per-turn arrays [B,K]: reductions from tokens and back, and the turn-credit primitive.

Keyed by `turn_id` [B,T] (−1 outside any turn: prompt, observations, padding) and a per-turn
validity mask `valid_BK` (`step_mask` in the rollout contract: turn k of row b took place).

Every turn-level estimator (IGPO, A2TGPO, SIOP, TRACE, MAPO, ProCredit, ...) is the same three
steps over per-turn rewards `r [B,K]`:

1. `turn_normalize`: z-score over the valid (b, k) cells that share a key: the prompt group
   (`by="pooled"`), the group and the turn index (`by="index"`), or the group and any per-turn
   key such as a role or workflow stage (`by="key"`);
2. `turn_returns`: discounted accumulation over the valid turns, `A_k = Σ_{k'≥k} γ^{n(k,k')} x_k'`
   (n counts valid turns between), optionally divided by √(number of accumulated terms);
3. `turn_broadcast`: each policy token of turn k gets `A_k`.
"""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops._cast import as_f32
from credit.ops.masked import safe_sqrt
from credit.ops.returns import discounted_reverse_cumsum

Array = jax.Array

__all__ = ["turn_reduce", "turn_broadcast", "turn_segments", "turn_normalize", "turn_returns",
           "turn_counts", "turn_edges", "turn_layout", "previous_valid", "row_grpo"]

TURN_NORMS = ("pooled", "index", "key")


def turn_reduce(x: ArrayLike, turn_id: ArrayLike, num_turns: int,
                mask: ArrayLike | None = None,
                reduce: Literal["sum", "mean", "count"] = "sum") -> Array:
  """Per-turn reduction [B,T] -> [B,K] using `turn_id` (−1 = outside any turn)."""
  check_choice("turn_reduce", "reduce", reduce, ("sum", "mean", "count"))
  x = as_f32(x)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([x, tid])
  B = x.shape[0]
  ok = (tid >= 0) & (tid < num_turns)
  if mask is not None:
    ok = ok & jnp.asarray(mask, bool)
  seg = jnp.where(ok, jnp.arange(B, dtype=jnp.int32)[:, None] * num_turns + tid, B * num_turns)
  n = B * num_turns + 1

  def per_turn(v):
    return jax.ops.segment_sum(v.reshape(-1), seg.reshape(-1), n)[:-1].reshape(B, num_turns)

  if reduce == "count":
    return per_turn(ok.astype(jnp.float32))
  s = per_turn(jnp.where(ok, x, 0.0))
  if reduce == "sum":
    return s
  return s / jnp.maximum(per_turn(ok.astype(jnp.float32)), 1.0)


_SELECT_TURNS = 16  # turn_broadcast: up to this many turns, selects instead of a gather


def turn_broadcast(x_BK: ArrayLike, turn_id: ArrayLike, mask: ArrayLike | None = None) -> Array:
  """[B,K] -> [B,T]: each token gets its turn's value, 0 outside turns / mask."""
  x = as_f32(x_BK)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_rank([x, tid], 2)
  K = x.shape[1]
  ok = (tid >= 0) & (tid < K)
  if mask is not None:
    ok = ok & jnp.asarray(mask, bool)
  if K <= _SELECT_TURNS:   # a chain of K selects: ~5x faster than a gather on XLA CPU
    out = jnp.zeros(tid.shape, jnp.float32)
    for k in range(K):
      out = jnp.where(tid == k, x[:, k:k + 1], out)
  else:
    out = jnp.take_along_axis(x, jnp.clip(tid, 0, K - 1), axis=1)
  return jnp.where(ok, out, 0.0)


def turn_segments(group_id: ArrayLike, num_groups: int, num_turns: int, *,
                  by: Literal["pooled", "index", "key"] = "pooled",
                  key: ArrayLike | None = None, num_keys: int | None = None
                  ) -> tuple[Array, int]:
  """Segment id of every (b, k) cell and the number of segments, for `turn_normalize`.

  pooled: the prompt group g (all turns of all samples of the prompt in one pool);
  index:  (g, k), the samples of the prompt that took turn k;
  key:    (g, key[b,k]) with `key` [B,K] int in [0, num_keys) (role, workflow stage).
  Cells whose group or key is out of range get segment id −1 (dropped).
  """
  check_choice("turn_segments", "by", by, TURN_NORMS)
  gid = jnp.asarray(group_id, jnp.int32)
  chex.assert_rank(gid, 1)
  ok_B = (gid >= 0) & (gid < num_groups)
  g_BK = jnp.broadcast_to(gid[:, None], (gid.shape[0], num_turns))
  if by == "pooled":
    seg, n = g_BK, num_groups
    ok = jnp.broadcast_to(ok_B[:, None], seg.shape)
  elif by == "index":
    seg, n = g_BK * num_turns + jnp.arange(num_turns, dtype=jnp.int32)[None, :], \
        num_groups * num_turns
    ok = jnp.broadcast_to(ok_B[:, None], seg.shape)
  else:
    if key is None or num_keys is None:
      raise ValueError("turn_segments(by='key') needs `key` [B,K] and the static `num_keys`")
    k_BK = jnp.asarray(key, jnp.int32)
    chex.assert_shape(k_BK, (gid.shape[0], num_turns))
    seg, n = g_BK * num_keys + k_BK, num_groups * num_keys
    ok = ok_B[:, None] & (k_BK >= 0) & (k_BK < num_keys)
  return jnp.where(ok, seg, -1), n


def turn_normalize(x_BK: ArrayLike, valid_BK: ArrayLike, group_id: ArrayLike, num_groups: int,
                   *, by: Literal["pooled", "index", "key"] = "pooled",
                   key: ArrayLike | None = None, num_keys: int | None = None,
                   scale: bool = True, ddof: int = 0, eps: float = 1e-6,
                   var_eps: float = 0.0, min_count: int = 2,
                   small: Literal["zero", "raw", "centred"] = "zero") -> Array:
  """Z-score of per-turn values over the valid cells of each segment (`turn_segments`).

  .. math::  x̂_{b,k} = (x_{b,k} − μ_s) / (\\sqrt{σ_s^2 + var_eps} + eps)

  with σ² the variance with `ddof` (0: population, as IGPO; 1: unbiased, as SIOP/MatchTIR),
  computed shifted (segment max as pivot) for float32 accuracy.

  Args:
    x_BK: [B,K] per-turn values; entries outside `valid_BK` are ignored (may be NaN).
    valid_BK: [B,K] bool, the cells that exist and take part.
    group_id, num_groups: prompt group of each row; static segment count.
    by, key, num_keys: the pooling (`turn_segments`).
    scale: divide by the std (False: centre only).
    ddof, eps, var_eps: as in the formula.
    min_count: segments with fewer valid cells are "small" and get the `small` rule:
      "zero" (0, the default), "raw" (the value unnormalised: μ=0, σ=1, verl's singleton
      convention), "centred" (x − μ, no scaling).
  Returns:
    [B,K] float32, exact zeros outside `valid_BK`.
  """
  check_choice("turn_normalize", "small", small, ("zero", "raw", "centred"))
  x = as_f32(x_BK)
  valid = jnp.asarray(valid_BK, bool)
  chex.assert_rank([x, valid], 2)
  chex.assert_equal_shape([x, valid])
  B, K = x.shape
  seg_BK, n = turn_segments(group_id, num_groups, K, by=by, key=key, num_keys=num_keys)
  ok = valid & (seg_BK >= 0)
  seg = jnp.where(ok, seg_BK, n).reshape(-1)
  okf = ok.reshape(-1).astype(jnp.float32)
  v = jnp.where(ok, x, 0.0).reshape(-1)
  ns = n + 1
  count = jax.ops.segment_sum(okf, seg, ns)
  pivot = jax.ops.segment_max(jnp.where(okf > 0, v, -jnp.inf), seg, ns)
  pivot = jnp.where(count > 0, pivot, 0.0)
  d = jnp.where(okf > 0, v - pivot[seg], 0.0)
  mean_d = jax.ops.segment_sum(d, seg, ns) / jnp.maximum(count, 1.0)
  cen = jnp.where(okf > 0, d - mean_d[seg], 0.0)
  ss = jax.ops.segment_sum(cen * cen, seg, ns)
  var = jnp.where(count > ddof, ss / jnp.maximum(count - ddof, 1.0), 0.0)
  std = safe_sqrt(var + var_eps)
  out = cen / (std[seg] + eps) if scale else cen
  c = count[seg]
  small_val = {"zero": jnp.zeros_like(v), "raw": v, "centred": cen}[small]
  out = jnp.where(c < min_count, small_val, out)
  return jnp.where(ok, out.reshape(B, K), 0.0)


def turn_edges(turn_id: ArrayLike, mask: ArrayLike, num_turns: int, *, last: bool) -> Array:
  """[B,T] bool: the last (`last=True`) or first token under `mask` of each turn / step k in
  [0, num_turns) (one segment max / min over (row, k); O(B·T))."""
  tid = jnp.asarray(turn_id, jnp.int32)
  m = jnp.asarray(mask).astype(bool)
  chex.assert_equal_shape([tid, m])
  B, T = tid.shape
  ok = m & (tid >= 0) & (tid < num_turns)
  t_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))
  seg = jnp.where(ok, jnp.arange(B, dtype=jnp.int32)[:, None] * num_turns + tid,
                  B * num_turns).reshape(-1)
  if last:
    edge = jax.ops.segment_max(jnp.where(ok, t_BT, -1).reshape(-1), seg, B * num_turns + 1)
  else:
    edge = jax.ops.segment_min(jnp.where(ok, t_BT, T).reshape(-1), seg, B * num_turns + 1)
  return ok & (t_BT == edge[seg].reshape(B, T))


def turn_counts(valid_BK: ArrayLike) -> Array:
  """Number of valid turns from k to the end of each row, [B,K] float32 (0 at invalid k)."""
  v = jnp.asarray(valid_BK, bool)
  return jnp.where(v, jax.lax.cumsum(v.astype(jnp.float32), axis=1, reverse=True), 0.0)


def turn_returns(x_BK: ArrayLike, valid_BK: ArrayLike, gamma: ArrayLike = 1.0, *,
                 sqrt_n: bool = False) -> Array:
  """Discounted accumulation over the valid turns: A_k = x_k + γ·A_{next valid k'}.

  Invalid turns neither add, reset nor discount. `sqrt_n=True` divides A_k by
  √(number of valid turns from k to the end) (A2TGPO's rescaled accumulation).
  Returns [B,K] float32, 0 at invalid turns.
  """
  out = discounted_reverse_cumsum(x_BK, valid_BK, gamma)
  if sqrt_n:
    out = out / jnp.sqrt(jnp.maximum(turn_counts(valid_BK), 1.0))
  return out


# --------------------------------------------------------------------------------------------
# Layout of a multi-turn batch, shared by the turn estimators (IGPO, A2TGPO, TRACE, SIOP, ...).
# --------------------------------------------------------------------------------------------


def turn_layout(response_mask: ArrayLike, step_mask: ArrayLike, turn_id: ArrayLike
                ) -> tuple[Array, Array, Array, Array, Array]:
  """(mask_BT, row_B, valid_BK, last_BK, tid_BT) of a multi-turn batch.

  row_B: the row has a policy token (an all-masked row is invalid); valid_BK: turn k of a
  valid row took place (`step_mask`); last_BK: the last valid turn of each row.
  """
  mask_BT = jnp.asarray(response_mask).astype(bool)
  step_BK = jnp.asarray(step_mask).astype(bool)
  tid_BT = jnp.asarray(turn_id, jnp.int32)
  chex.assert_rank([mask_BT, step_BK, tid_BT], 2)
  chex.assert_equal_shape([mask_BT, tid_BT])
  chex.assert_equal_shape_prefix([mask_BT, step_BK], 1)
  row_B = jnp.any(mask_BT, axis=1)
  valid_BK = step_BK & row_B[:, None]
  last_BK = valid_BK & (turn_counts(valid_BK) == 1.0)
  return mask_BT, row_B, valid_BK, last_BK, tid_BT


def previous_valid(x_BK: Array, valid_BK: Array, x0_B: Array) -> Array:
  """[B,K]: x at the previous valid turn of each turn (x0 before the first valid turn).

  Turns outside `valid_BK` are skipped, so turn k compares with the last valid turn before
  it (a gather: exact, no arithmetic on x).
  """
  B, K = x_BK.shape
  idx = jnp.where(valid_BK, jnp.arange(1, K + 1, dtype=jnp.int32)[None, :], 0)
  seen = jax.lax.cummax(idx, axis=1)
  prev = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), seen[:, :-1]], axis=1)
  full = jnp.concatenate([x0_B[:, None], x_BK], axis=1)
  return jnp.take_along_axis(full, prev, axis=1)


def row_grpo(reward: ArrayLike, row_B: Array, group_id: ArrayLike, num_groups: int, *,
             ddof: int = 1, eps: float = 1e-6, singleton: str = "zero") -> Array:
  """GRPO z-score of one value per valid row, [B] (a [B,1] `turn_normalize`)."""
  x = jnp.where(row_B, as_f32(reward), 0.0)[:, None]
  return turn_normalize(x, row_B[:, None], group_id, num_groups, by="pooled", ddof=ddof,
                        eps=eps, small=singleton)[:, 0]
