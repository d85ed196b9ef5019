"""Tests for credit.models.hf_io (Hugging Face checkpoints) and credit.models.hf_tokenizer.

transformers (PyTorch, CPU) is the numerical reference: tiny random checkpoints of each family are
written with its save_pretrained, loaded with ours, and compared on a left-padded batch.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from credit.models import (ChatTemplateError, Decoder, UnsupportedCheckpointError,  # noqa: E402
                           config_from_hf, config_to_hf, from_pretrained, load_tokenizer,
                           save_pretrained)

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
               "rope_theta": 500000.0}
FAMILIES = {
    "llama3": lambda: transformers.LlamaConfig(**TINY, rope_parameters=dict(LLAMA3_ROPE),
                                               eos_token_id=[1, 2]),
    "qwen2": lambda: transformers.Qwen2Config(**TINY, rope_theta=1e6),
    "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=24),
    "qwen3_tied": lambda: transformers.Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True),
}


def _hf_model(name, dtype=torch.float32):
  torch.manual_seed(sum(map(ord, name)))
  model = transformers.AutoModelForCausalLM.from_config(FAMILIES[name]()).eval()
  with torch.no_grad():
    for p in model.parameters():  # every parameter random: biases and norms too
      torch.nn.init.normal_(p, mean=0.0, std=0.3)
  return model.to(dtype)


def _batch():
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, 128, (3, 10))
  mask = np.ones((3, 10), bool)
  mask[1, :3] = False
  mask[2, :8] = False
  return tokens, mask


def _hf_logits(model, tokens, mask):
  pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                position_ids=torch.tensor(pos))
  return out.logits.float().numpy()


_forward = nnx.jit(lambda m, t, k: m(t, mask_BT=k)[0])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (hf model, dir); qwen2 also saved sharded."""
  out = {}
  for name in FAMILIES:
    model = _hf_model(name)
    d = tmp_path_factory.mktemp(name)
    model.save_pretrained(d)
    out[name] = (model, d)
  model, _ = out["qwen2"]
  d = tmp_path_factory.mktemp("qwen2_sharded")
  model.save_pretrained(d, max_shard_size="40KB")
  out["qwen2_sharded"] = (model, d)
  return out


@pytest.mark.parametrize("name", ["llama3", "qwen2", "qwen3", "qwen3_tied", "qwen2_sharded"])
def test_logits_match_transformers(checkpoints, name):
  hf, d = checkpoints[name]
  if name.endswith("sharded"):
    assert (d / "model.safetensors.index.json").exists()
    assert len(list(d.glob("model-*.safetensors"))) > 1
  model, cfg = from_pretrained(d)
  assert isinstance(model, Decoder) and cfg.param_dtype == "float32"
  assert cfg.family == name.split("_")[0].replace("llama3", "llama")
  tokens, mask = _batch()
  ref = _hf_logits(hf, tokens, mask)
  got = np.asarray(_forward(model, jnp.asarray(tokens), jnp.asarray(mask)))
  scale = np.abs(ref[mask]).max()
  assert scale > 1.0  # random weights give non-trivial logits
  np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4 * scale, rtol=1e-4)


def test_llama3_rope_scaling_matters(checkpoints, tmp_path):
  """The same checkpoint read without its frequency scaling gives different logits."""
  hf, d = checkpoints["llama3"]
  _, cfg = from_pretrained(d)
  assert cfg.rope_scaling_dict["factor"] == 8.0 and cfg.rope_theta == 500000.0
  assert cfg.eos_token_ids == (1, 2)
  hf_cfg = json.loads((d / "config.json").read_text())
  hf_cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
  (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
  (tmp_path / "model.safetensors").symlink_to(d / "model.safetensors")
  plain, plain_cfg = from_pretrained(tmp_path)
  assert plain_cfg.rope_scaling is None
  tokens, mask = _batch()
  ref = _hf_logits(hf, tokens, mask)
  got = np.asarray(_forward(plain, jnp.asarray(tokens), jnp.asarray(mask)))
  assert np.abs(got[mask] - ref[mask]).max() > 1e-2


def test_tied_embeddings(checkpoints):
  hf, d = checkpoints["qwen3_tied"]
  model, cfg = from_pretrained(d)
  assert cfg.tie_embeddings and model.lm_head is None
  np.testing.assert_array_equal(np.asarray(model.unembedding()),
                                hf.lm_head.weight.detach().numpy().T)


@pytest.mark.parametrize("name", ["llama3", "qwen2", "qwen3_tied"])
def test_save_then_transformers_load_is_exact(checkpoints, name, tmp_path):
  hf, d = checkpoints[name]
  model, cfg = from_pretrained(d)
  save_pretrained(model, cfg, tmp_path)
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
  assert type(back) is type(hf)
  sd_ref, sd_back = hf.state_dict(), back.state_dict()
  assert sorted(sd_ref) == sorted(sd_back)
  for k, v in sd_ref.items():
    assert torch.equal(v, sd_back[k]), k
  hf_cfg = json.loads((tmp_path / "config.json").read_text())
  assert config_from_hf(hf_cfg) == cfg
  assert back.config.tie_word_embeddings == cfg.tie_embeddings


def test_sharded_save_and_mesh_load(checkpoints, tmp_path):
  """Our sharded save loads in transformers; loading onto a mesh places params by their rules."""
  hf, d = checkpoints["qwen2"]
  model, cfg = from_pretrained(d)
  save_pretrained(model, cfg, tmp_path, max_shard_bytes=50_000)
  assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
  for k, v in hf.state_dict().items():
    assert torch.equal(v, back.state_dict()[k]), k

  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  sharded, _ = from_pretrained(tmp_path, mesh=mesh)
  P = jax.sharding.PartitionSpec
  q = sharded.layers[1].self_attn.q_proj
  assert q.kernel[...].sharding.spec == P("fsdp", "tensor", None)
  assert q.bias[...].sharding.spec == P("tensor", None)
  assert sharded.embed_tokens.embedding[...].sharding.spec == P("tensor", "fsdp")
  tokens, mask = _batch()
  ref = _hf_logits(hf, tokens, mask)
  with jax.set_mesh(mesh):
    got = np.asarray(_forward(sharded, jnp.asarray(tokens), jnp.asarray(mask)))
  np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4 * np.abs(ref).max(), rtol=1e-4)


def test_bfloat16_checkpoint(tmp_path):
  hf = _hf_model("qwen3_tied", torch.bfloat16)
  hf.save_pretrained(tmp_path / "in")
  model, cfg = from_pretrained(tmp_path / "in")
  assert cfg.param_dtype == "bfloat16" and cfg.dtype == "bfloat16"
  emb = model.embed_tokens.embedding[...]
  assert emb.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(emb, np.float32),
                                hf.model.embed_tokens.weight.detach().float().numpy())
  save_pretrained(model, cfg, tmp_path / "out")
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
  assert back.dtype == torch.bfloat16
  for k, v in hf.state_dict().items():
    assert torch.equal(v, back.state_dict()[k]), k
  # dtype overrides: bf16 weights upcast to f32 storage
  m32, c32 = from_pretrained(tmp_path / "in", param_dtype="float32")
  assert c32.param_dtype == "float32" and m32.embed_tokens.embedding[...].dtype == jnp.float32


def _copy_ckpt(src, dst, config_edit=None, tensors_edit=None):
  dst.mkdir()
  cfg = json.loads((src / "config.json").read_text())
  if config_edit:
    config_edit(cfg)
  (dst / "config.json").write_text(json.dumps(cfg))
  tensors = load_file(str(src / "model.safetensors"))
  if tensors_edit:
    tensors_edit(tensors)
  save_file(tensors, str(dst / "model.safetensors"))
  return dst


def test_clear_errors(checkpoints, tmp_path):
  _, d = checkpoints["llama3"]
  with pytest.raises(FileNotFoundError, match="does not exist"):
    from_pretrained(tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="config.json"):
    from_pretrained(tmp_path / "empty")
  (tmp_path / "noweights").mkdir()
  (tmp_path / "noweights" / "config.json").write_text((d / "config.json").read_text())
  (tmp_path / "noweights" / "pytorch_model.bin").write_text("")
  with pytest.raises(FileNotFoundError, match="model.safetensors.*pytorch_model.bin"):
    from_pretrained(tmp_path / "noweights")

  def set_(k, v):
    return lambda c: c.__setitem__(k, v)
  with pytest.raises(UnsupportedCheckpointError, match="'mistral'"):
    from_pretrained(_copy_ckpt(d, tmp_path / "a", set_("model_type", "mistral")))
  with pytest.raises(UnsupportedCheckpointError, match="GPT2LMHeadModel"):
    from_pretrained(_copy_ckpt(d, tmp_path / "b", set_("architectures", ["GPT2LMHeadModel"])))
  with pytest.raises(UnsupportedCheckpointError, match="yarn"):
    from_pretrained(_copy_ckpt(d, tmp_path / "c", set_(
        "rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})))
  with pytest.raises(UnsupportedCheckpointError, match="attention_bias"):
    from_pretrained(_copy_ckpt(d, tmp_path / "d", set_("attention_bias", True)))
  missing = "model.layers.1.mlp.up_proj.weight"
  with pytest.raises(KeyError, match=missing.replace(".", r"\.")):
    from_pretrained(_copy_ckpt(d, tmp_path / "e", tensors_edit=lambda t: t.pop(missing)))
  with pytest.raises(UnsupportedCheckpointError, match="extra.weight"):
    from_pretrained(_copy_ckpt(d, tmp_path / "f", tensors_edit=lambda t: t.__setitem__(
        "model.extra.weight", np.zeros(3, np.float32))))
  with pytest.raises(ValueError, match="shape"):
    from_pretrained(_copy_ckpt(d, tmp_path / "g", set_("intermediate_size", 80)))


def test_config_from_hf_v4_spelling():
  v4 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32,
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "torch_dtype": "bfloat16", "tie_word_embeddings": True, "eos_token_id": 7,
        "rms_norm_eps": 1e-5}
  cfg = config_from_hf(v4)
  assert cfg.head_dim == 4 and cfg.rope_theta == 500000.0 and cfg.param_dtype == "bfloat16"
  assert cfg.rope_scaling_dict["factor"] == 32.0 and cfg.rms_norm_eps == 1e-5
  assert cfg.tie_embeddings and cfg.eos_token_id == 7 and not cfg.qkv_bias
  v5 = config_to_hf(cfg)
  assert v5["rope_parameters"]["rope_theta"] == 500000.0 and v5["dtype"] == "bfloat16"
  assert config_from_hf(v5) == cfg
  loaded = transformers.LlamaConfig.from_dict(v5)  # transformers reads our config the same way
  assert loaded.rope_parameters["rope_type"] == "llama3"
  assert loaded.rope_parameters["rope_theta"] == 500000.0


# ------------------------------------------------------------------------------ tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _write_tokenizer(d, *, template=True, template_file=False):
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  specials = ["<unk>", "<pad>", "<s>", "<|im_start|>", "<|im_end|>"]
  trainer = trainers.WordLevelTrainer(special_tokens=specials)
  tok.train_from_iterator(["the cat sat on the mat", "what is two plus two", "four",
                           "system user assistant you are helpful"], trainer=trainer)
  d.mkdir(parents=True, exist_ok=True)
  tok.save(str(d / "tokenizer.json"))
  cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
         "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": True}, "pad_token": "<pad>"}
  if template and not template_file:
    cfg["chat_template"] = CHAT_TEMPLATE
  (d / "tokenizer_config.json").write_text(json.dumps(cfg))
  if template_file:
    (d / "chat_template.jinja").write_text(CHAT_TEMPLATE)
  return tok


def test_tokenizer_and_chat_template(tmp_path):
  raw = _write_tokenizer(tmp_path / "t")
  (tmp_path / "t" / "generation_config.json").write_text(json.dumps({"eos_token_id": [4, 1]}))
  tok = load_tokenizer(tmp_path / "t")
  assert tok.eos_token_id == raw.token_to_id("<|im_end|>") == 4
  assert tok.pad_token_id == raw.token_to_id("<pad>") and tok.bos_token_id == 2
  assert tok.eos_token_ids == (4, 1)
  ids = tok.encode("the cat sat")
  assert len(ids) == 3 and tok.decode(ids) == "the cat sat"
  msgs = [{"role": "system", "content": "you are helpful"},
          {"role": "user", "content": "what is two plus two"}]
  text = tok.apply_chat_template(msgs)
  assert text == ("<|im_start|>system\nyou are helpful<|im_end|>\n"
                  "<|im_start|>user\nwhat is two plus two<|im_end|>\n<|im_start|>assistant\n")
  assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("two<|im_end|>\n")
  ids = tok.apply_chat_template(msgs, tokenize=True)
  assert ids == tok.encode(text, add_special_tokens=False) and ids[0] == 3
  # transformers renders the same template identically
  ref = transformers.AutoTokenizer.from_pretrained(tmp_path / "t")
  assert ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == text


def test_tokenizer_template_file_and_missing_template(tmp_path):
  _write_tokenizer(tmp_path / "f", template_file=True)
  tok = load_tokenizer(tmp_path / "f")
  assert tok.apply_chat_template([{"role": "user", "content": "four"}]).startswith(
      "<|im_start|>user\nfour<|im_end|>")
  _write_tokenizer(tmp_path / "n", template=False)
  tok = load_tokenizer(tmp_path / "n")
  with pytest.raises(ChatTemplateError, match="no chat template"):
    tok.apply_chat_template([{"role": "user", "content": "four"}])
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    load_tokenizer(tmp_path)
