"""Masked reductions and whitening: exact zeros where the mask selects nothing.

Batch statistics are two-pass (shift by a first mean, then correct), so values such as
[1000, 1000, 1000, 1000.01] keep their differences in float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.ops._cast import as_f32, mask_f32

Array = jax.Array

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "weighted_whiten",
           "safe_sqrt", "safe_div"]


def _bool_mask(mask: ArrayLike | None, like: Array) -> Array | None:
  """`mask` broadcast to `like` when it is boolean, else None (weights take the float path).

  A boolean mask selects with `where` and needs no float copy: the values summed are the
  same as with its 0/1 float form (x·1 = x), without writing a [B,T] float array first.
  """
  if mask is None or jnp.asarray(mask).dtype != jnp.bool_:
    return None
  return jnp.broadcast_to(jnp.asarray(mask), like.shape)


def masked_sum(x: ArrayLike, mask: ArrayLike | None = None, axis=None) -> Array:
  """Σ x·m over `axis`; masked entries (even NaN/inf ones) contribute exactly 0."""
  x = as_f32(x)
  b = _bool_mask(mask, x)
  if b is not None:
    return jnp.sum(jnp.where(b, x, 0.0), axis=axis)
  m = mask_f32(mask, x)
  return jnp.sum(jnp.where(m > 0, x * m, 0.0), axis=axis)


def masked_mean(x: ArrayLike, mask: ArrayLike | None = None, axis=None) -> Array:
  """Σ x·m / max(Σ m, 1): 0 where the mask selects nothing."""
  x = as_f32(x)
  b = _bool_mask(mask, x)
  if b is not None:
    return masked_sum(x, b, axis) / jnp.maximum(jnp.sum(b, axis=axis, dtype=jnp.float32), 1.0)
  m = mask_f32(mask, x)
  return masked_sum(x, m, axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def masked_var(x: ArrayLike, mask: ArrayLike | None = None, axis=None,
               unbiased: bool = True) -> Array:
  """Masked variance (Bessel-corrected by default), two-pass for accuracy.

  Returns 0 when fewer than two (unbiased) or one (biased) entries are valid.
  """
  x = as_f32(x)
  m = mask_f32(mask, x)
  count = jnp.sum(m, axis=axis, keepdims=True)
  mean1 = masked_sum(x, m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)
  mean1 = jnp.expand_dims(mean1, axis) if axis is not None else mean1
  d = jnp.where(m > 0, x - mean1, 0.0)
  dmean = jnp.sum(d * m, axis=axis, keepdims=True) / jnp.maximum(count, 1.0)
  ss = jnp.sum(jnp.square(d - dmean) * m, axis=axis, keepdims=True)
  denom = count - 1.0 if unbiased else count
  var = jnp.where(denom > 0, ss / jnp.maximum(denom, 1.0), 0.0)
  return jnp.squeeze(var, axis) if axis is not None else jnp.squeeze(var)


def masked_whiten(x: ArrayLike, mask: ArrayLike | None = None, *,
                  shift_mean: bool = True, eps: float = 1e-8) -> Array:
  """Whitening over all valid entries (verl `masked_whiten`), zero outside the mask.

  y = (x − m)·(v + eps)^{-1/2}·M with m the masked mean and v the unbiased masked
  variance. With fewer than two valid entries the output is 0 (v is undefined).
  With `shift_mean=False` the mean is added back (scale only).
  """
  x = as_f32(x)
  b = _bool_mask(mask, x)
  if b is None:
    m = mask_f32(mask, x)
    count, sel = jnp.sum(m), m > 0

    def weigh(v):
      return v * m
  else:  # the same sums, selected by `where` (see `_bool_mask`)
    count, sel = jnp.sum(b, dtype=jnp.float32), b

    def weigh(v):
      return jnp.where(b, v, 0.0)
  mean1 = masked_mean(x, b if b is not None else m)
  d = jnp.where(sel, x - mean1, 0.0)
  dmean = jnp.sum(weigh(d)) / jnp.maximum(count, 1.0)
  centred = d - dmean
  var = jnp.sum(weigh(jnp.square(centred))) / jnp.maximum(count - 1.0, 1.0)
  y = centred * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    y = y + (mean1 + dmean)
  return jnp.where(sel & (count > 1), y, 0.0)


def weighted_whiten(x_B: ArrayLike, weight_B: ArrayLike, eps: float = 1e-8) -> Array:
  """Whitening of per-row values where row i counts `weight_B[i]` times ([B] -> [B]).

  With `weight_B` = response lengths this equals
  `masked_whiten(broadcast_to_tokens(x_B, M), M)` on the valid tokens (verl whitens the
  broadcast [B,T] array), at O(B) instead of O(B·T). Two-pass (shift by a first mean,
  then correct) for accuracy. Rows with zero weight give 0; so does every row when the
  total weight is below 2.
  """
  x = as_f32(x_B)
  w = as_f32(weight_B)
  n = jnp.sum(w)
  m1 = jnp.sum(w * x) / jnp.maximum(n, 1.0)
  d = jnp.where(w > 0, x - m1, 0.0)
  c = d - jnp.sum(w * d) / jnp.maximum(n, 1.0)
  var = jnp.sum(w * c * c) / jnp.maximum(n - 1.0, 1.0)
  return jnp.where((w > 0) & (n > 1), c * jax.lax.rsqrt(var + eps), 0.0)


def safe_sqrt(x: Array) -> Array:
  """sqrt with a finite (zero) gradient at 0, so all-equal groups differentiate."""
  pos = x > 0
  return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def safe_div(num: ArrayLike, den: ArrayLike) -> Array:
  """num/den where den != 0, else 0; the unused branch never divides by zero."""
  num, den = jnp.asarray(num), jnp.asarray(den)
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)
