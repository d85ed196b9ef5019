"""Decoder-only transformer in Flax NNX covering Llama 3, Qwen2/2.5 and Qwen3.

One pre-norm block, repeated L times::

  h = x + o_proj(Attn(RoPE(q_norm(q_proj(rms(x)))), RoPE(k_norm(k_proj(rms(x)))), v_proj(rms(x))))
  y = h + down_proj(silu(gate_proj(rms(h))) ⊙ up_proj(rms(h)))

with RMSNorm ``rms(x) = w ⊙ x / sqrt(mean(x²) + ε)`` (Zhang & Sennrich, "Root Mean Square Layer
Normalization", arXiv:1910.07467), rotary position embeddings (Su et al., "RoFormer",
arXiv:2104.09864) in the "rotate half" layout of the Llama/Qwen checkpoints, grouped-query attention
(Ainslie et al., "GQA", arXiv:2305.13245: query head n reads key/value head n // (N/K)), SwiGLU
(Shazeer, "GLU Variants Improve Transformer", arXiv:2002.05202). Llama 3 (arXiv:2407.21783) adds a
piecewise frequency scaling of RoPE; Qwen2 (arXiv:2407.10671) adds biases to q/k/v; Qwen3
(arXiv:2505.09388) adds RMSNorm over head_dim on q and k before RoPE. Every formula was checked
against the transformers 5.x PyTorch modelling code (modeling_llama.py, modeling_qwen2.py,
modeling_qwen3.py, modeling_rope_utils.py `_compute_llama3_parameters`), which the tests use as the
numerical reference (logits equal within 1e-4 in float32).

Layouts (letters as in the einsum strings): B batch, T new tokens, S key/cache slots, D model width,
N query heads, K kv heads, G = N/K queries per kv head, H head_dim, F mlp width, V vocab, L layers.
Parameters carry logical axis names in their ``out_sharding`` metadata (see ``sharding.py``):
  embed_tokens.embedding [V,D] (vocab, embed)       lm_head.kernel [D,V] (embed, vocab)
  q_proj.kernel [D,N,H] (embed, q_heads, head_dim)  k_proj/v_proj.kernel [D,K,H] (embed, kv_heads, head_dim)
  o_proj.kernel [N,H,D] (q_heads, head_dim, embed)  q/k/v biases [N|K,H] (q_heads|kv_heads, head_dim)
  gate_proj/up_proj.kernel [D,F] (embed, mlp)       down_proj.kernel [F,D] (mlp, embed)
  *_layernorm.weight, norm.weight [D] (norm)        q_norm/k_norm.weight [H] (head_dim)
Variables are created with ``eager_sharding=False`` so a model can be built without a mesh; place it
on a mesh with ``credit.models.sharding.shard_model``.

KV cache (gemma-style sampling, as in flax `examples/gemma`): prompts are left-padded, so every row
writes the same slots; ``valid`` marks real tokens; RoPE positions are ``cumsum(mask) - 1`` per row,
continued across decode steps from the number of valid slots already in the cache. A cached call
reads only the slots before ``index + T`` (later ones are masked by causality anyway), rounded up
to one of a few static sizes (`cache_read_sizes`: 64, 128, 256, ... and the cache size), so a decode
step costs the filled length, not the capacity the cache was allocated with.
"""
from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct

from credit.models.config import DTYPES, ModelConfig

Array = jax.Array

# Additive mask value: finite so that a query with no visible key (a pad row) gets a uniform
# softmax instead of NaN. Rows like that are padding and their outputs are never used.
_MASK_VALUE = float(np.finfo(np.float32).min)
_INIT_STD = 0.02  # Hugging Face `initializer_range` default.


@struct.dataclass
class KVCache:
  """Key/value cache of all layers.

  Attributes:
    k: [L, B, K, S, H] keys after RoPE (and k_norm), in the cache dtype.
    v: [L, B, K, H, S] values (slots last: the layout of the attention-weighted sum).
    valid: [B, S] bool, slots holding real (non-pad) tokens.
    index: [] int32, next slot to write; the same for every row.
  """
  k: Array
  v: Array
  valid: Array
  index: Array

  @property
  def size(self) -> int:
    return self.k.shape[3]


def init_cache(config: ModelConfig, batch_size: int, cache_size: int, dtype=None) -> KVCache:
  """An empty cache: zeros, no valid slot, index 0. dtype defaults to the compute dtype."""
  dtype = config.jnp_dtype if dtype is None else (DTYPES[dtype] if isinstance(dtype, str) else dtype)
  l, k, h = config.num_layers, config.num_kv_heads, config.head_dim
  return KVCache(k=jnp.zeros((l, batch_size, k, cache_size, h), dtype),
                 v=jnp.zeros((l, batch_size, k, h, cache_size), dtype),
                 valid=jnp.zeros((batch_size, cache_size), jnp.bool_),
                 index=jnp.zeros((), jnp.int32))


def _param(value, axes: tuple) -> nnx.Param:
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def _normal(rngs: nnx.Rngs, shape, dtype) -> Array:
  return (_INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


class Einsum(nnx.Module):
  """A linear map written as one einsum, e.g. ``"BTD,DNH->BTNH"``, with an optional bias.

  The kernel's letters are those after the comma; the bias has the output letters that are not in
  the input (e.g. ``NH``). Computation runs in ``dtype``; parameters are stored in ``param_dtype``.
  """

  def __init__(self, einsum_str: str, kernel_shape: tuple, kernel_axes: tuple, *,
               bias: bool = False, param_dtype=jnp.float32, dtype=jnp.float32, rngs: nnx.Rngs):
    self.einsum_str = einsum_str
    self.dtype = dtype
    self.kernel = _param(_normal(rngs, kernel_shape, param_dtype), kernel_axes)
    if bias:
      lhs, out = einsum_str.split("->")
      x_letters, k_letters = lhs.split(",")
      bias_letters = [c for c in out if c not in x_letters]
      bias_shape = tuple(kernel_shape[k_letters.index(c)] for c in bias_letters)
      bias_axes = tuple(kernel_axes[k_letters.index(c)] for c in bias_letters)
      self.bias = _param(jnp.zeros(bias_shape, param_dtype), bias_axes)
    else:
      self.bias = None

  def __call__(self, x: Array) -> Array:
    y = jnp.einsum(self.einsum_str, x.astype(self.dtype), self.kernel[...].astype(self.dtype))
    if self.bias is not None:
      b = self.bias[...].astype(self.dtype)
      y = y + b.reshape((1,) * (y.ndim - b.ndim) + b.shape)
    return y


class RMSNorm(nnx.Module):
  """``w ⊙ x / sqrt(mean(x²) + ε)`` over the last axis; statistics in float32.

  Matches transformers' LlamaRMSNorm: normalise in float32, cast to the compute dtype, then scale.
  """

  def __init__(self, dim: int, *, eps: float, axis_name: str = "norm", param_dtype=jnp.float32,
               dtype=jnp.float32):
    self.eps = eps
    self.dtype = dtype
    self.weight = _param(jnp.ones((dim,), param_dtype), (axis_name,))

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = (x32 * jax.lax.rsqrt(var + self.eps)).astype(self.dtype)
    w = self.weight[...].astype(self.dtype)
    return w.reshape((1,) * (y.ndim - 1) + w.shape) * y


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """Inverse RoPE frequencies ``θ^(-2i/H)``, i < H/2, float32, with optional Llama-3 scaling.

  Llama 3.1 scaling (wavelength λ = 2π/f, c = original context, factor s, low/high factors l, h):
  λ < c/h keeps f; λ > c/l uses f/s; in between interpolates (1-a)·f/s + a·f with
  a = (c/λ - l)/(h - l). Verified against transformers `_compute_llama3_parameters`.
  """
  h = config.head_dim
  inv = (1.0 / (np.float32(config.rope_theta) ** (np.arange(0, h, 2, dtype=np.float32) /
                                                 np.float32(h)))).astype(np.float32)
  sc = config.rope_scaling_dict
  if sc is None:
    return inv
  rope_type = sc.get("rope_type", "llama3")
  if rope_type != "llama3":
    raise NotImplementedError(f"rope_scaling type {rope_type!r} is not supported (only 'llama3')")
  factor = float(sc["factor"])
  low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
  old_ctx = float(sc["original_max_position_embeddings"])
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > old_ctx / low, inv / factor, inv)
  smooth = (old_ctx / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < old_ctx / high) & ~(wavelen > old_ctx / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x_BTNH: Array, positions_BT: Array, inv_freq: np.ndarray) -> Array:
  """Rotate pairs (x_i, x_{i+H/2}) by angle pos·f_i ("rotate half" layout), in float32."""
  chex.assert_rank(x_BTNH, 4)
  chex.assert_rank(positions_BT, 2)
  ang_BTF = positions_BT.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq)[None, None, :]
  cos_BT1F = jnp.cos(ang_BTF)[:, :, None, :]
  sin_BT1F = jnp.sin(ang_BTF)[:, :, None, :]
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos_BT1F - x2 * sin_BT1F, x2 * cos_BT1F + x1 * sin_BT1F], axis=-1)
  return out.astype(x_BTNH.dtype)


# Smallest number of cache slots a cached attention call reads; the read sizes double from it
# up to the cache size (see `cache_read_sizes`).
CACHE_READ_BLOCK = 64


def cache_read_sizes(num_new: int, cache_size: int, block: int = CACHE_READ_BLOCK
                     ) -> tuple[int, ...]:
  """The static slot counts a cached attention call may read: ``block·2^i`` below the cache size,
  then the cache size itself; sizes smaller than ``num_new`` (never enough) are left out.

  A call that writes T tokens at slot ``index`` reads the smallest size ``>= index + T`` (every
  later slot is masked by causality), so a decode step costs at most twice the filled length
  (plus one block) whatever the cache's capacity, and the number of compiled branches grows only
  with ``log2(cache_size / block)``.

  Args:
    num_new: T, tokens written by the call (static).
    cache_size: S, slots of the cache (static).
    block: the smallest read size.

  Returns:
    Increasing sizes, the last one ``cache_size``.

  Example:
    >>> cache_read_sizes(1, 300)
    (64, 128, 256, 300)
  """
  sizes = []
  n = block
  while n < cache_size:
    if n >= num_new:
      sizes.append(n)
    n *= 2
  return tuple(sizes) + (cache_size,)


def _attend(q_BTNH: Array, k_BKSH: Array, v_BKHS: Array, mask_BTS: Array, *, num_kv_heads: int,
            dtype) -> Array:
  """Masked softmax attention of T queries over S keys: ``softmax(q·kᵀ/√H + mask)·v``, scores in
  float32, queries grouped per kv head (GQA). Returns [B,T,N,H] in ``dtype``."""
  b, t, n, h = q_BTNH.shape
  q_BTKGH = q_BTNH.reshape(b, t, num_kv_heads, n // num_kv_heads, h)
  s_BKGTS = jnp.einsum("BTKGH,BKSH->BKGTS", q_BTKGH, k_BKSH,
                       preferred_element_type=jnp.float32) * (h ** -0.5)
  s_BKGTS = jnp.where(mask_BTS[:, None, None, :, :], s_BKGTS, _MASK_VALUE)
  p_BKGTS = jax.nn.softmax(s_BKGTS, axis=-1).astype(dtype)
  o_BTKGH = jnp.einsum("BKGTS,BKHS->BTKGH", p_BKGTS, v_BKHS)
  return o_BTKGH.reshape(b, t, n, h)


class Attention(nnx.Module):
  """Grouped-query causal self-attention with optional qkv bias (Qwen2) and qk-norm (Qwen3)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    d, n, k, h = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    kw = dict(param_dtype=c.jnp_param_dtype, dtype=c.jnp_dtype, rngs=rngs)
    self.config = c
    self.q_proj = Einsum("BTD,DNH->BTNH", (d, n, h), ("embed", "q_heads", "head_dim"),
                         bias=c.qkv_bias, **kw)
    self.k_proj = Einsum("BTD,DKH->BTKH", (d, k, h), ("embed", "kv_heads", "head_dim"),
                         bias=c.qkv_bias, **kw)
    self.v_proj = Einsum("BTD,DKH->BTKH", (d, k, h), ("embed", "kv_heads", "head_dim"),
                         bias=c.qkv_bias, **kw)
    self.o_proj = Einsum("BTNH,NHD->BTD", (n, h, d), ("q_heads", "head_dim", "embed"), **kw)
    if c.qk_norm:
      nkw = dict(eps=c.rms_norm_eps, axis_name="head_dim", param_dtype=c.jnp_param_dtype,
                 dtype=c.jnp_dtype)
      self.q_norm = RMSNorm(h, **nkw)
      self.k_norm = RMSNorm(h, **nkw)
    else:
      self.q_norm = None
      self.k_norm = None

  def __call__(self, x_BTD: Array, positions_BT: Array, mask_BTS: Array, *,
               kv: tuple | None = None) -> tuple[Array, tuple | None]:
    """Attention of T queries over S keys.

    Args:
      x_BTD: normed inputs.
      positions_BT: RoPE positions of the T new tokens.
      mask_BTS: bool, which keys each query may read (causality and padding already folded in).
      kv: None (keys are the T new tokens, S == T) or (k_LBKSH, v_LBKHS, layer, index): the new
        keys/values are written to slots [index, index+T) of layer `layer` (a static int) and
        attention reads that layer's slots [0, index+T) rounded up to one of
        `cache_read_sizes(T, S)`, so the cost follows the filled length, not the capacity S.

    Returns:
      (out_BTD, None or the updated (k_LBKSH, v_LBKHS)).
    """
    c = self.config
    inv_freq = rope_inv_freq(c)
    q_BTNH = self.q_proj(x_BTD)
    k_BTKH = self.k_proj(x_BTD)
    v_BTKH = self.v_proj(x_BTD)
    if self.q_norm is not None:
      q_BTNH = self.q_norm(q_BTNH)
      k_BTKH = self.k_norm(k_BTKH)
    q_BTNH = apply_rope(q_BTNH, positions_BT, inv_freq)
    k_BTKH = apply_rope(k_BTKH, positions_BT, inv_freq)

    # Keys as [B,K,S,H] and values as [B,K,H,S]: the operand layouts of the two batched dots
    # of `_attend`, so that reading the cache needs no transpose (with [B,S,K,H] XLA:CPU copied
    # the whole layer cache into these layouts on every decode step).
    if kv is None:
      o_BTNH = _attend(q_BTNH, jnp.swapaxes(k_BTKH, 1, 2), jnp.transpose(v_BTKH, (0, 2, 3, 1)),
                       mask_BTS, num_kv_heads=c.num_kv_heads, dtype=c.jnp_dtype)
      return self.o_proj(o_BTNH), None

    k_all, v_all, layer, index = kv
    k_all = jax.lax.dynamic_update_slice(
        k_all, jnp.swapaxes(k_BTKH, 1, 2)[None].astype(k_all.dtype), (layer, 0, 0, index, 0))
    v_all = jax.lax.dynamic_update_slice(
        v_all, jnp.transpose(v_BTKH, (0, 2, 3, 1))[None].astype(v_all.dtype),
        (layer, 0, 0, 0, index))

    # Only the filled slots are read: [0, index + T) rounded up to a static read size, one
    # branch per size (slots past index + T are masked by causality, so the result is the same
    # as reading all S slots, up to float summation order).
    def read(size: int):
      def attend(q_BTNH, k_all, v_all, mask_BTS):
        return _attend(q_BTNH, k_all[layer, :, :, :size].astype(c.jnp_dtype),
                       v_all[layer, :, :, :, :size].astype(c.jnp_dtype), mask_BTS[:, :, :size],
                       num_kv_heads=c.num_kv_heads, dtype=c.jnp_dtype)
      return attend

    t = q_BTNH.shape[1]
    sizes = cache_read_sizes(t, k_all.shape[3], CACHE_READ_BLOCK)
    if len(sizes) == 1:
      o_BTNH = read(sizes[0])(q_BTNH, k_all, v_all, mask_BTS)
    else:
      branch = jnp.sum(jnp.asarray(sizes[:-1], jnp.int32) < index + t)
      o_BTNH = jax.lax.switch(branch, [read(size) for size in sizes], q_BTNH, k_all, v_all,
                              mask_BTS)
    return self.o_proj(o_BTNH), (k_all, v_all)


class MLP(nnx.Module):
  """SwiGLU: ``down(silu(gate(x)) ⊙ up(x))``."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    d, f = c.hidden_size, c.intermediate_size
    kw = dict(param_dtype=c.jnp_param_dtype, dtype=c.jnp_dtype, rngs=rngs)
    self.gate_proj = Einsum("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
    self.up_proj = Einsum("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
    self.down_proj = Einsum("BTF,FD->BTD", (f, d), ("mlp", "embed"), **kw)

  def __call__(self, x_BTD: Array) -> Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x_BTD)) * self.up_proj(x_BTD))


class DecoderLayer(nnx.Module):
  """Pre-norm block: attention then SwiGLU, each with a residual connection."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    nkw = dict(eps=c.rms_norm_eps, param_dtype=c.jnp_param_dtype, dtype=c.jnp_dtype)
    self.input_layernorm = RMSNorm(c.hidden_size, **nkw)
    self.self_attn = Attention(c, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(c.hidden_size, **nkw)
    self.mlp = MLP(c, rngs=rngs)

  def __call__(self, x_BTD, positions_BT, mask_BTS, *, kv=None):
    a_BTD, kv = self.self_attn(self.input_layernorm(x_BTD), positions_BT, mask_BTS, kv=kv)
    h_BTD = x_BTD + a_BTD
    return h_BTD + self.mlp(self.post_attention_layernorm(h_BTD)), kv


class Embed(nnx.Module):
  """Token embedding table [V, D]."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.dtype = config.jnp_dtype
    self.embedding = _param(_normal(rngs, (config.vocab_size, config.hidden_size),
                                    config.jnp_param_dtype), ("vocab", "embed"))

  def __call__(self, tokens_BT: Array) -> Array:
    return jnp.take(self.embedding[...], tokens_BT, axis=0).astype(self.dtype)


def _block(layer: "DecoderLayer", x_BTD: Array, positions_BT: Array, mask_BTS: Array):
  """One cache-free block (the function the rematerialised variants wrap)."""
  return layer(x_BTD, positions_BT, mask_BTS)[0]


# A cache-free block whose activations are recomputed in the backward pass, per
# `ModelConfig.remat_policy`: "full" keeps only the block input; "projections" also keeps the
# outputs of the weight matmuls (dot products without batch dimensions: not attention's).
_REMAT_BLOCKS = {
    "full": nnx.remat(_block),
    "projections": nnx.remat(
        _block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
}


def default_positions(mask_BT: Array, cache: KVCache | None = None) -> Array:
  """RoPE positions ``cumsum(mask) - 1`` clipped at 0, offset by the valid slots already cached."""
  pos_BT = jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1
  if cache is not None:
    before_S = jnp.arange(cache.size, dtype=jnp.int32) < cache.index
    prior_B = jnp.sum(cache.valid & before_S[None, :], axis=1, dtype=jnp.int32)
    pos_BT = pos_BT + prior_B[:, None]
  return jnp.maximum(pos_BT, 0)


class Decoder(nnx.Module):
  """Llama / Qwen2 / Qwen3 decoder-only language model.

  Example:
    >>> cfg = tiny_config("qwen3")  # doctest: +SKIP
    >>> model = Decoder(cfg, rngs=nnx.Rngs(0))  # doctest: +SKIP
    >>> logits_BTV, _ = model(jnp.zeros((2, 5), jnp.int32))  # doctest: +SKIP
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    self.embed_tokens = Embed(c, rngs=rngs)
    self.layers = nnx.List([DecoderLayer(c, rngs=rngs) for _ in range(c.num_layers)])
    self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, param_dtype=c.jnp_param_dtype,
                        dtype=c.jnp_dtype)
    if c.tie_embeddings:
      self.lm_head = None
    else:
      self.lm_head = Einsum("BTD,DV->BTV", (c.hidden_size, c.vocab_size), ("embed", "vocab"),
                            param_dtype=c.jnp_param_dtype, dtype=c.jnp_dtype, rngs=rngs)

  def _forward(self, tokens_BT, positions_BT, mask_BT, cache):
    chex.assert_rank(tokens_BT, 2)
    b, t = tokens_BT.shape
    if mask_BT is None:
      mask_BT = jnp.ones((b, t), jnp.bool_)
    mask_BT = mask_BT.astype(jnp.bool_)
    chex.assert_shape(mask_BT, (b, t))
    if positions_BT is None:
      positions_BT = default_positions(mask_BT, cache)
    chex.assert_shape(positions_BT, (b, t))

    if cache is None:
      causal_TT = jnp.tril(jnp.ones((t, t), jnp.bool_))
      mask_BTS = causal_TT[None, :, :] & mask_BT[:, None, :]
    else:
      chex.assert_shape(cache.valid, (b, None))
      s = cache.size
      if t > s:
        raise ValueError(f"{t} new tokens do not fit a KV cache of {s} slots")
      if not isinstance(cache.index, jax.core.Tracer) and int(cache.index) + t > s:
        raise ValueError(f"KV cache overflow: index {int(cache.index)} + {t} new tokens > "
                         f"{s} slots (allocate a larger cache with init_cache)")
      index = cache.index.astype(jnp.int32)
      valid_BS = jax.lax.dynamic_update_slice(cache.valid, mask_BT, (0, index))
      slot_T = index + jnp.arange(t, dtype=jnp.int32)
      causal_TS = jnp.arange(s, dtype=jnp.int32)[None, :] <= slot_T[:, None]
      mask_BTS = causal_TS[None, :, :] & valid_BS[:, None, :]
      k_all, v_all = cache.k, cache.v

    x_BTD = self.embed_tokens(tokens_BT)
    for i, layer in enumerate(self.layers):
      if cache is None and self.config.remat:
        x_BTD = _REMAT_BLOCKS[self.config.remat_policy](layer, x_BTD, positions_BT, mask_BTS)
      elif cache is None:
        x_BTD, _ = layer(x_BTD, positions_BT, mask_BTS)
      else:
        x_BTD, (k_all, v_all) = layer(x_BTD, positions_BT, mask_BTS, kv=(k_all, v_all, i, index))
    h_BTD = self.norm(x_BTD)
    new_cache = None
    if cache is not None:
      new_cache = KVCache(k=k_all, v=v_all, valid=valid_BS, index=cache.index + t)
    return h_BTD, new_cache

  def __call__(self, tokens_BT: Array, positions_BT: Array | None = None, *,
               mask_BT: Array | None = None, cache: KVCache | None = None,
               return_hidden: bool = False) -> tuple[Array, KVCache | None]:
    """Forward pass.

    Args:
      tokens_BT: int token ids.
      positions_BT: RoPE positions; default ``cumsum(mask) - 1`` clipped at 0 (plus the number of
        valid cached slots when a cache is given), so left padding works.
      mask_BT: bool, real tokens (default all True). Without a cache, keys are restricted to it;
        with a cache it becomes ``cache.valid`` of the written slots.
      cache: None for a plain causal pass over the T tokens; else the T tokens are written at
        slots [index, index+T), queries read the valid slots up to their own, index advances by T.
        Outside jit an overflowing write (index + T > cache size) is a ValueError; under jit the
        index is traced and cannot be checked, so the caller keeps index + T <= cache size
        (jax.lax.dynamic_update_slice would clamp the start and overwrite the last slots);
        `credit.sampling.Sampler` sizes its cache and checks this before tracing.
      return_hidden: return the final-normed hidden states [B,T,D] (compute dtype) instead of
        logits.

    Returns:
      (logits_BTV float32 — or hidden_BTD —, the updated cache or None).
    """
    h_BTD, cache = self._forward(tokens_BT, positions_BT, mask_BT, cache)
    if return_hidden:
      return h_BTD, cache
    return self.logits(h_BTD), cache

  def hidden_states(self, tokens_BT: Array, positions_BT: Array | None = None, *,
                    mask_BT: Array | None = None) -> Array:
    """Final-normed hidden states [B,T,D] (compute dtype); logits = hidden @ unembedding()."""
    return self._forward(tokens_BT, positions_BT, mask_BT, None)[0]

  def unembedding(self) -> Array:
    """The [D, V] output matrix (param dtype): lm_head, or the transposed embedding when tied."""
    if self.lm_head is None:
      return self.embed_tokens.embedding[...].T
    return self.lm_head.kernel[...]

  def logits(self, h_BTD: Array) -> Array:
    """Float32 logits ``h @ unembedding()`` (inputs in the compute dtype, f32 accumulation)."""
    dt = self.config.jnp_dtype
    return jnp.einsum("BTD,DV->BTV", h_BTD.astype(dt), self.unembedding().astype(dt),
                      preferred_element_type=jnp.float32)

  def init_cache(self, batch_size: int, cache_size: int, dtype=None) -> KVCache:
    """An empty cache for this model (see the free function `init_cache`)."""
    return init_cache(self.config, batch_size, cache_size, dtype)
