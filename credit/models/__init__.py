"""Decoder-only transformers (Llama 3, Qwen2/2.5, Qwen3) in Flax NNX, HF I/O, tokenizer, LoRA.

The model interface `credit.sampling` and `credit.scoring` rely on: `Decoder.__call__` returning
logits, `Decoder.hidden_states` (hidden states and the unembedding for chunked scoring),
`init_cache` for the KV cache, and `ModelConfig` for the token ids (decoder.py documents them).
"""
from credit.models.config import ModelConfig, tiny_config
from credit.models.decoder import Decoder, KVCache, default_positions, init_cache, rope_inv_freq
from credit.models.hf_io import (UnsupportedCheckpointError, config_from_hf, config_to_hf,
                                 from_pretrained, param_mapping, save_pretrained)
from credit.models.presets import PRESETS, list_presets, preset
from credit.models.lora import (LoRAEinsum, LoRAParam, apply_lora, lora_trainable_mask,
                                merge_lora)
from credit.models.sharding import (DEFAULT_RULES, cache_sharding, logical_sharding,
                                    logical_to_mesh_axes, logical_to_mesh_sharding, shard_model)
from credit.models.hf_tokenizer import ChatTemplateError, Tokenizer, load_tokenizer

__all__ = [
    "ModelConfig", "tiny_config", "PRESETS", "preset", "list_presets", "Decoder", "KVCache", "init_cache", "default_positions",
    "rope_inv_freq", "DEFAULT_RULES", "logical_to_mesh_axes", "logical_sharding",
    "logical_to_mesh_sharding", "shard_model", "cache_sharding", "from_pretrained",
    "save_pretrained", "config_from_hf", "config_to_hf", "param_mapping",
    "UnsupportedCheckpointError", "LoRAParam", "LoRAEinsum", "apply_lora", "lora_trainable_mask",
    "merge_lora", "Tokenizer", "load_tokenizer", "ChatTemplateError",
]
