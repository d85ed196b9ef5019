"""Chunked-logits machinery shared by `credit.scoring` and `credit.divergences` (private).

Both modules walk a sequence in chunks of positions and, optionally, the vocabulary in chunks
of columns, so that no float32 [B,T,V] logits array is ever formed: the chunk sizes
(`make_cfg`, `auto_chunk_size`), the [B,T,...] <-> [n,B,c,...] reshapes (`to_chunks`,
`from_chunks`), one vocabulary chunk of the unembedding (`vocab_chunk`), a chunk's logits
(`chunk_logits`) and 1/τ (`inv_temperature`). Also the top-k bucket distribution
(`topk_buckets`: K full-softmax log-probs plus a tail bucket), which scoring returns for a
teacher's top-k and divergences compares. Import the public names from `credit.scoring` /
`credit.divergences`; this module is below both, so neither imports the other's internals.
"""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

Array = jax.Array
TailMode = Literal["bucket", "renormalize"]

# Default sequence chunk: `chunk_size=None` picks ROWS_PER_CHUNK // B positions per chunk, so the
# float32 working set is ~ROWS_PER_CHUNK·V·4 bytes whatever the batch (155 MB at V=151,936) and
# the logit matmul keeps an M dimension of a few hundred rows. 256 rows was the fastest of
# 128/256/512 in benchmarks/scoring.py (CPU); it is also a multiple of the TPU MXU tile.
ROWS_PER_CHUNK = 256
DEFAULT_CHUNK_SIZE = None
NEG_INIT = -0.5 * float(np.finfo(np.float32).max)  # finite "−∞" for online maxima.
TAIL_FLOOR = 1e-8  # floor of the tail-bucket probability: log(1e-8) ≈ −18.4 keeps logs finite.


# --------------------------------------------------------------------------
# Chunking helpers.
# --------------------------------------------------------------------------


@jax.tree_util.register_static
class Static:
  """Hashable static payload that passes through custom_vjp residuals (no array leaves)."""

  def __init__(self, **kw):
    self.__dict__.update(kw)

  def __hash__(self):
    return hash(tuple(sorted(self.__dict__.items())))

  def __eq__(self, other):
    return isinstance(other, Static) and self.__dict__ == other.__dict__


def auto_chunk_size(batch: int, length: int, rows: int = ROWS_PER_CHUNK) -> int:
  """Positions per chunk so that one chunk holds about `rows` (batch × positions) rows."""
  return max(1, min(max(length, 1), rows // max(batch, 1)))


def resolve_chunk(t: int, chunk_size: int) -> tuple[int, int]:
  """(chunk, number of chunks) for a length-t axis; t is padded up to chunk·n."""
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
  c = min(int(chunk_size), max(t, 1))
  return c, -(-t // c)


def to_chunks(x: Array, c: int, n: int) -> Array:
  """[B,T,...] -> [n,B,c,...], zero-padding T up to n·c."""
  b, t = x.shape[:2]
  pad = n * c - t
  if pad:
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape((b, n, c) + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def from_chunks(x: Array, t: int) -> Array:
  """[n,B,c,...] -> [B,T,...] (drops the padding)."""
  n, b, c = x.shape[:3]
  x = jnp.moveaxis(x, 0, 1).reshape((b, n * c) + x.shape[3:])
  return x[:, :t]


def vocab_chunk(w_DV: Array, i, cv: int, v: int, nv: int):
  """Columns of vocab chunk i: (w [D,cv], first id, valid [cv] or None).

  The last chunk is shifted left to end at V (no padding of W is ever made); columns it shares
  with the previous chunk are marked invalid so each id is counted exactly once.
  """
  if nv == 1:
    return w_DV, 0, None
  start = jnp.minimum(i * cv, v - cv)
  w = jax.lax.dynamic_slice_in_dim(w_DV, start, cv, axis=1)
  valid = (start + jnp.arange(cv)) >= i * cv
  return w, start, valid[None, None, :]


def chunk_logits(h_BcD: Array, w_DV: Array, inv_tau, precision) -> Array:
  z = jnp.einsum("bcd,dv->bcv", h_BcD, w_DV, preferred_element_type=jnp.float32,
                 precision=precision)
  return z if inv_tau is None else z * inv_tau


def make_cfg(b: int, t: int, v: int, chunk_size: int | None, vocab_chunk_size: int | None,
             precision) -> Static:
  if chunk_size is None:
    chunk_size = auto_chunk_size(b, t)
  c, n = resolve_chunk(t, chunk_size)
  if vocab_chunk_size is None or vocab_chunk_size >= v:
    cv, nv = v, 1
  else:
    cv, nv = resolve_chunk(v, vocab_chunk_size)
  return Static(c=c, n=n, v=v, cv=cv, nv=nv, precision=precision)


def inv_temperature(temperature) -> Array | None:
  """1/τ as a float32 scalar, or None for a static τ = 1 (no rescaling pass at all)."""
  if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) \
      and temperature == 1:
    return None
  return 1.0 / jnp.asarray(temperature, jnp.float32)


# --------------------------------------------------------------------------
# Top-k buckets.
# --------------------------------------------------------------------------


def log1mexp(x: Array) -> Array:
  """log(1 − eˣ) for x ≤ 0, stable at both ends (Mächler 2012)."""
  x = jnp.minimum(x, -1e-30)
  near0 = x > -0.6931472
  # Each branch sees only inputs where it is finite (NaN in an unused branch poisons grads).
  a = jnp.log(-jnp.expm1(jnp.where(near0, x, -1.0)))
  b = jnp.log1p(-jnp.exp(jnp.where(near0, -1.0, x)))
  return jnp.where(near0, a, b)


def topk_buckets(logprob_BTK: ArrayLike, *, tail: TailMode = "bucket") -> Array:
  """Turns full-softmax log-probs of K ids into a normalised distribution over buckets.

  tail="bucket": K + 1 buckets, the last one ``log max(1 − Σ_k p_k, TAIL_FLOOR)`` (all the mass
  outside the K ids; the floor keeps logs finite when the K ids hold all the mass).
  tail="renormalize": K buckets ``ℓ_k − logsumexp_k ℓ_k`` (the distribution conditioned on the
  top-k set).

  Returns:
    [..., K+1] or [..., K] float32 log-probs.
  """
  lp = jnp.asarray(logprob_BTK, jnp.float32)
  lse = jax.nn.logsumexp(lp, axis=-1, keepdims=True)
  if tail == "renormalize":
    return lp - lse
  if tail != "bucket":
    raise ValueError(f"tail must be 'bucket' or 'renormalize', got {tail!r}")
  log_tail = jnp.maximum(log1mexp(lse), jnp.log(TAIL_FLOOR))
  return jnp.concatenate([lp, log_tail], axis=-1)
