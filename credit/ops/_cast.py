"""Array coercions shared by the ops modules."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def as_f32(x: ArrayLike) -> jax.Array:
  return jnp.asarray(x, dtype=jnp.float32)


def mask_f32(mask: ArrayLike | None, like: jax.Array) -> jax.Array:
  """`mask` broadcast to `like` as float32 0/1 (all ones when None)."""
  if mask is None:
    return jnp.ones(like.shape, jnp.float32)
  return jnp.broadcast_to(jnp.asarray(mask), like.shape).astype(jnp.float32)
