"""Model presets: the exact shapes of published Qwen3, Qwen2.5 and Llama 3.2 checkpoints.

Each preset is the `ModelConfig` that `config_from_hf` makes of the model's published
``config.json`` (vocabulary, width, MLP width, layers, query and key/value heads, head width,
RoPE base and scaling, RMSNorm ε, tied embeddings, special ids, context length), in float32. A
preset gives a randomly initialised model of the real size (`Decoder(preset("qwen3-0.6b"),
rngs=...)`), a memory plan (`experiments/memory.py`) or a benchmark shape without downloading
anything; loading the checkpoint itself stays `from_pretrained`, whose config it equals.

The Qwen2.5 presets are the base models (``eos_token_id`` 151643, ``<|endoftext|>``); their
-Instruct variants differ only in the eos id (151645) and, for 1.5B, the recorded context
(32,768). The Qwen3 presets are the released (post-trained) models, whose eos is ``<|im_end|>``
(151645); the -Base checkpoints end with 151643. Llama 3.2 presets are the base models (eos
128001; -Instruct lists three eos ids).

Parameter counts (tied embeddings counted once), which `tests/models/presets_test.py` checks
against the model cards: Qwen3-0.6B 596,049,920; Qwen3-1.7B 1,720,574,976; Qwen3-4B
4,022,468,096; Qwen2.5-0.5B 494,032,768; Qwen2.5-1.5B 1,543,714,304; Llama-3.2-1B 1,235,814,400;
Llama-3.2-3B 3,212,749,824.
"""
from __future__ import annotations

import difflib
import types

from credit.models.config import ModelConfig

_QWEN_VOCAB = 151936
_LLAMA_VOCAB = 128256
# Llama 3.1/3.2's RoPE frequency scaling (`rope_type: llama3`), as `ModelConfig.rope_scaling`
# in the order `config_from_hf` writes it (so a preset equals the loaded checkpoint's config).
_LLAMA32_ROPE_SCALING = (("factor", 32.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0),
                         ("original_max_position_embeddings", 8192))


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int) -> ModelConfig:
  return ModelConfig(
      vocab_size=_QWEN_VOCAB, hidden_size=hidden, intermediate_size=intermediate,
      num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0,
      rms_norm_eps=1e-6, tie_embeddings=True, qk_norm=True, max_position_embeddings=40960,
      family="qwen3", bos_token_id=151643, eos_token_id=151645)


def _qwen25(hidden: int, intermediate: int, layers: int, heads: int, context: int) -> ModelConfig:
  return ModelConfig(
      vocab_size=_QWEN_VOCAB, hidden_size=hidden, intermediate_size=intermediate,
      num_layers=layers, num_heads=heads, num_kv_heads=2, head_dim=hidden // heads,
      rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_embeddings=True, qkv_bias=True,
      max_position_embeddings=context, family="qwen2", bos_token_id=151643,
      eos_token_id=151643)


def _llama32(hidden: int, layers: int, heads: int, head_dim: int) -> ModelConfig:
  return ModelConfig(
      vocab_size=_LLAMA_VOCAB, hidden_size=hidden, intermediate_size=8192, num_layers=layers,
      num_heads=heads, num_kv_heads=8, head_dim=head_dim, rope_theta=500_000.0,
      rope_scaling=_LLAMA32_ROPE_SCALING, rms_norm_eps=1e-5, tie_embeddings=True,
      max_position_embeddings=131072, family="llama", bos_token_id=128000, eos_token_id=128001)


# name -> ModelConfig (read-only). Names are the Hugging Face model names, lower-cased.
PRESETS: types.MappingProxyType = types.MappingProxyType({
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32),
    "qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 32768),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 131072),
    "llama-3.2-1b": _llama32(2048, 16, 32, 64),
    "llama-3.2-3b": _llama32(3072, 28, 24, 128),
})


def list_presets() -> list[str]:
  """The preset names, sorted."""
  return sorted(PRESETS)


def preset(name: str, **overrides) -> ModelConfig:
  """The `ModelConfig` of a published model, with any field replaced.

  Args:
    name: a key of `PRESETS` (case-insensitive), e.g. "qwen3-0.6b", "llama-3.2-1b".
    **overrides: `ModelConfig` fields to change, e.g. ``num_layers=1`` (a real-width model
      with fewer blocks), ``param_dtype="bfloat16"``, ``remat=True``.

  Returns:
    The frozen config.

  Raises:
    KeyError: an unknown name (the message lists the presets and the closest one).
    TypeError: an override that is not a `ModelConfig` field.

  Example:
    >>> preset("qwen3-0.6b", num_layers=1).hidden_size
    1024
  """
  key = str(name).strip().lower()
  if key not in PRESETS:
    close = difflib.get_close_matches(key, list(PRESETS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise KeyError(f"model preset {name!r} is unknown; {hint}presets: {', '.join(list_presets())}")
  return PRESETS[key].replace(**overrides) if overrides else PRESETS[key]
