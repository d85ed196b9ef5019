"""credit.models.presets: the published shapes, checked by parameter count and HF round trip."""
import jax
import pytest
from flax import nnx

from credit import models
from credit.models import Decoder, config_from_hf, config_to_hf, preset

# Parameters on each model card / safetensors index (tied embeddings counted once).
PUBLISHED = {
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 1_720_574_976,
    "qwen3-4b": 4_022_468_096,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
}


def _count(cfg) -> int:
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def test_every_preset_is_listed_and_exported():
  assert models.list_presets() == sorted(PUBLISHED)
  assert set(models.PRESETS) == set(PUBLISHED)
  assert "preset" in models.__all__ and models.preset is preset


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_decoder_of_a_preset_has_the_published_parameter_count(name):
  cfg = preset(name)
  one, two = _count(cfg.replace(num_layers=1)), _count(cfg.replace(num_layers=2))
  assert one + (cfg.num_layers - 1) * (two - one) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_preset_survives_the_hugging_face_config_round_trip(name):
  cfg = preset(name)
  back = config_from_hf(config_to_hf(cfg), param_dtype="float32")
  assert back == cfg
  hf = config_to_hf(cfg)
  assert hf["tie_word_embeddings"] is True and hf["vocab_size"] in (151936, 128256)


def test_published_details():
  q3 = preset("qwen3-0.6b")
  assert (q3.hidden_size, q3.intermediate_size, q3.num_layers, q3.num_heads, q3.num_kv_heads,
          q3.head_dim) == (1024, 3072, 28, 16, 8, 128)
  assert q3.qk_norm and not q3.qkv_bias and q3.rope_theta == 1e6 and q3.eos_token_id == 151645
  q25 = preset("qwen2.5-0.5b")
  assert q25.qkv_bias and not q25.qk_norm and q25.head_dim == 64 and q25.num_kv_heads == 2
  llama = preset("llama-3.2-3b")
  assert llama.rope_scaling_dict == {"factor": 32.0, "high_freq_factor": 4.0,
                                     "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 8192}
  assert llama.rms_norm_eps == 1e-5 and llama.head_dim == 128 and llama.rope_theta == 5e5


def test_overrides_and_unknown_names():
  cfg = preset("Qwen3-0.6B", num_layers=1, param_dtype="bfloat16", remat=True)
  assert (cfg.num_layers, cfg.param_dtype, cfg.remat, cfg.hidden_size) == (1, "bfloat16", True,
                                                                           1024)
  assert preset("qwen3-0.6b").num_layers == 28  # the table is not changed by an override
  with pytest.raises(KeyError, match="did you mean 'qwen3-0.6b'"):
    preset("qwen3-0.6")
  with pytest.raises(TypeError):
    preset("qwen3-0.6b", num_blocks=1)
  with pytest.raises(TypeError):
    models.PRESETS["mine"] = cfg
