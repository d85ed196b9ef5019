"""A tiny random decoder for the character tokenizer, shared by the multi-turn engine tests."""
from __future__ import annotations

import functools

import jax
from flax import nnx

from credit.models import Decoder
from credit.models.config import tiny_config


@functools.lru_cache(maxsize=None)
def scaled_tiny_decoder(vocab_size: int, scale: float = 3.0) -> Decoder:
  """A qwen3-style tiny `Decoder` (seed 0) whose weight matrices are multiplied by `scale`,
  so that sampling is far from uniform and different prefixes give different continuations."""
  model = Decoder(tiny_config("qwen3", vocab_size=vocab_size), rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, params))
  return model
