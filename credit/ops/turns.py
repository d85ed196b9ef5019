"""Per-turn reductions [B,T] -> [B,K] and back, keyed by `turn_id` (−1 outside any turn)."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops._cast import as_f32

Array = jax.Array

__all__ = ["turn_reduce", "turn_broadcast"]


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


def turn_broadcast(x_BK: ArrayLike, turn_id: ArrayLike, mask: ArrayLike | None = None) -> Array:
  """[B,K] -> [B,T]: each token gets its turn's value, 0 outside turns / mask."""
  x = as_f32(x_BK)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_rank([x, tid], 2)
  K = x.shape[1]
  ok = (tid >= 0) & (tid < K)
  if mask is not None:
    ok = ok & jnp.asarray(mask, bool)
  out = jnp.take_along_axis(x, jnp.clip(tid, 0, K - 1), axis=1)
  return jnp.where(ok, out, 0.0)
