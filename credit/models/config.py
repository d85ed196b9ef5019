"""Static configuration of the decoder-only transformer (Llama 3, Qwen2/2.5, Qwen3)."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

FAMILIES = ("llama", "qwen2", "qwen3")
# What a rematerialised block keeps for the backward besides its input (`ModelConfig.remat_policy`).
REMAT_POLICIES = ("full", "projections")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and switches of one decoder; frozen and hashable (a valid jit static argument).

  Attributes:
    vocab_size: V, rows of the embedding table.
    hidden_size: D, residual width.
    intermediate_size: F, SwiGLU hidden width.
    num_layers: L, transformer blocks.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (grouped-query attention, N % K == 0).
    head_dim: H, width of one head (need not equal D / N).
    rope_theta: RoPE base θ; frequencies θ^(-2i/H).
    rope_scaling: None, or the Llama-3.1 frequency scaling as a tuple of (name, value) pairs with
      names "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"
      (a tuple, not a dict, to stay hashable).
    rms_norm_eps: ε inside every RMSNorm.
    tie_embeddings: unembedding is the transposed token embedding (no lm_head parameter).
    qkv_bias: q/k/v projections carry a bias (Qwen2/2.5).
    qk_norm: RMSNorm over head_dim on each query and key head before RoPE (Qwen3).
    max_position_embeddings: recorded for export; RoPE itself has no length limit.
    param_dtype: storage dtype of parameters, "float32" or "bfloat16".
    dtype: compute dtype of activations, "float32" or "bfloat16" (softmax, norms statistics and
      logits are always float32).
    family: "llama" | "qwen2" | "qwen3", used for Hugging Face export.
    bos_token_id, eos_token_id, pad_token_id: special ids recorded from / for config.json.
      eos_token_id may be an int or a tuple of ints.
    remat: rematerialise each block in the backward pass of a cache-free forward (activation
      checkpointing, `nnx.remat`): only the [B,T,D] block inputs are kept for the backward, at
      the cost of one more forward per block. Values and gradients are unchanged. Not exported.
    remat_policy: what a rematerialised block keeps besides its input (`REMAT_POLICIES`):
      "full" nothing (the whole block is recomputed); "projections" the outputs of its weight
      matmuls (q, k, v, o, gate, up, down projections: `dots_with_no_batch_dims_saveable`), so
      the backward recomputes only norms, RoPE, attention and the activation function, about
      a third of a block's FLOPs at long sequence less than "full", for (2D + (N + 2K)H + 2F)
      values per token and block. Used only with `remat`.
  """
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rope_scaling: tuple | None = None
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = False
  qkv_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"
  family: str = "llama"
  bos_token_id: int | None = None
  eos_token_id: int | tuple | None = None
  pad_token_id: int | None = None
  remat: bool = False
  remat_policy: str = "full"

  def __post_init__(self):
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"remat_policy={self.remat_policy!r}; expected one of {REMAT_POLICIES}")
    if self.family not in FAMILIES:
      raise ValueError(f"family={self.family!r}; expected one of {FAMILIES}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {tuple(DTYPES)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

  @property
  def jnp_dtype(self):
    """Compute dtype as a jnp dtype."""
    return DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    """Parameter dtype as a jnp dtype."""
    return DTYPES[self.param_dtype]

  @property
  def rope_scaling_dict(self) -> dict | None:
    return None if self.rope_scaling is None else dict(self.rope_scaling)

  @property
  def eos_token_ids(self) -> tuple:
    """All end-of-sequence ids as a tuple (possibly empty)."""
    if self.eos_token_id is None:
      return ()
    if isinstance(self.eos_token_id, int):
      return (self.eos_token_id,)
    return tuple(self.eos_token_id)

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


def tiny_config(family: str = "llama", **overrides) -> ModelConfig:
  """A small config for tests and examples (V=128, D=64, 2 layers, 4 heads, 2 kv heads)."""
  base = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=16, family=family,
              qkv_bias=family == "qwen2", qk_norm=family == "qwen3")
  base.update(overrides)
  return ModelConfig(**base)
