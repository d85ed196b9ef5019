"""Hugging Face checkpoint I/O: config.json <-> ModelConfig, safetensors <-> Decoder parameters.

Supported: `LlamaForCausalLM` (model_type "llama", incl. Llama-3.1 "llama3" RoPE scaling),
`Qwen2ForCausalLM` ("qwen2", Qwen2/2.5), `Qwen3ForCausalLM` ("qwen3"). Anything the decoder does not
implement (other architectures, attention/mlp biases on Llama/Qwen3, sliding windows, other RoPE
types, activations other than SiLU) is refused with an error naming the field, never silently
ignored; so is a checkpoint tensor that no parameter consumes.

Layout conversion (HF nn.Linear stores weight [out, in]; ours are einsum kernels):
  q/k/v_proj.weight [(N·H), D]  -> kernel [D, N, H]      q/k/v_proj.bias [(N·H)] -> [N, H]
  o_proj.weight     [D, (N·H)]  -> kernel [N, H, D]      gate/up_proj.weight [F, D] -> [D, F]
  down_proj.weight  [D, F]      -> kernel [F, D]         lm_head.weight [V, D] -> kernel [D, V]
  embed_tokens.weight [V, D] and every norm weight are unchanged.
transformers v5 configs keep `rope_theta` (and the scaling) in `rope_parameters` and write `dtype`
instead of `torch_dtype`; both spellings are read.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from credit.models.config import DTYPES, ModelConfig
from credit.models.decoder import Decoder
from credit.models.sharding import DEFAULT_RULES, logical_sharding
from credit.parallel import to_host

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Checkpoint tensors that carry no parameter of ours.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32",
              "half": "float32", "float": "float32"}


class UnsupportedCheckpointError(ValueError):
  """The checkpoint uses a model type or feature this decoder does not implement."""


# ----------------------------------------------------------------------------------- configs


def _rope_from_hf(hf: dict) -> tuple[float, tuple | None]:
  params = hf.get("rope_parameters")
  if isinstance(params, dict) and "rope_theta" not in params and any(
      isinstance(v, dict) for v in params.values()):
    raise UnsupportedCheckpointError("per-layer-type rope_parameters are not supported")
  if not isinstance(params, dict):
    params = hf.get("rope_scaling") or {}
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type in (None, "default"):
    return float(theta), None
  if rope_type != "llama3":
    raise UnsupportedCheckpointError(
        f"rope type {rope_type!r} is not supported (only 'default' and 'llama3')")
  missing = [k for k in _ROPE_KEYS if k not in params]
  if missing:
    raise UnsupportedCheckpointError(f"llama3 rope scaling lacks {missing}")
  scaling = tuple((k, float(params[k]) if k != "original_max_position_embeddings"
                   else int(params[k])) for k in _ROPE_KEYS)
  return float(theta), scaling


def config_from_hf(hf: dict, *, dtype: str | None = None,
                   param_dtype: str | None = None) -> ModelConfig:
  """ModelConfig from a Hugging Face config.json dict (transformers v4 or v5 spelling).

  param_dtype defaults to the checkpoint's `dtype` / `torch_dtype` (float16 -> float32), dtype
  (compute) defaults to param_dtype. Raises UnsupportedCheckpointError naming the offending field.
  """
  model_type = hf.get("model_type")
  if model_type not in ARCHITECTURES:
    raise UnsupportedCheckpointError(
        f"model_type {model_type!r} is not supported; supported: {sorted(ARCHITECTURES)}")
  archs = hf.get("architectures") or []
  bad = [a for a in archs if a not in ARCHITECTURES.values()]
  if bad:
    raise UnsupportedCheckpointError(
        f"architectures {bad} not supported; supported: {sorted(ARCHITECTURES.values())}")
  act = hf.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise UnsupportedCheckpointError(f"hidden_act {act!r} is not supported (only 'silu')")
  if hf.get("mlp_bias"):
    raise UnsupportedCheckpointError("mlp_bias=True is not supported")
  if model_type != "qwen2" and hf.get("attention_bias"):
    raise UnsupportedCheckpointError(f"attention_bias=True is not supported for {model_type}")
  if hf.get("use_sliding_window"):
    raise UnsupportedCheckpointError("use_sliding_window=True is not supported")
  layer_types = hf.get("layer_types") or []
  if any(t != "full_attention" for t in layer_types):
    raise UnsupportedCheckpointError(f"layer_types {sorted(set(layer_types))} not supported")
  if hf.get("partial_rotary_factor", 1.0) != 1.0:
    raise UnsupportedCheckpointError("partial_rotary_factor != 1 is not supported")

  ckpt_dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if param_dtype is None:
    param_dtype = _HF_DTYPES.get(str(ckpt_dtype).replace("torch.", ""), "float32")
  dtype = param_dtype if dtype is None else dtype
  heads = hf["num_attention_heads"]
  theta, scaling = _rope_from_hf(hf)
  eos = hf.get("eos_token_id")
  return ModelConfig(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      rope_theta=theta, rope_scaling=scaling, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=model_type == "qwen2", qk_norm=model_type == "qwen3",
      max_position_embeddings=hf.get("max_position_embeddings", 4096),
      param_dtype=param_dtype, dtype=dtype, family=model_type,
      bos_token_id=hf.get("bos_token_id"), pad_token_id=hf.get("pad_token_id"),
      eos_token_id=tuple(eos) if isinstance(eos, list) else eos)


def config_to_hf(config: ModelConfig) -> dict:
  """config.json dict (transformers v5 spelling) that `AutoConfig` loads back to this model."""
  c = config
  rope = {"rope_type": "default", "rope_theta": c.rope_theta}
  if c.rope_scaling is not None:
    rope = {"rope_type": "llama3", "rope_theta": c.rope_theta, **c.rope_scaling_dict}
  eos = c.eos_token_id
  hf: dict[str, Any] = {
      "architectures": [ARCHITECTURES[c.family]], "model_type": c.family,
      "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
      "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
      "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
      "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
      "rope_parameters": rope, "max_position_embeddings": c.max_position_embeddings,
      "tie_word_embeddings": c.tie_embeddings, "dtype": c.param_dtype,
      "bos_token_id": c.bos_token_id, "pad_token_id": c.pad_token_id,
      "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
      "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
  }
  if c.family in ("llama", "qwen3"):
    hf["attention_bias"] = False
  if c.family == "llama":
    hf["mlp_bias"] = False
  if c.family in ("qwen2", "qwen3"):
    hf["use_sliding_window"] = False
    hf["sliding_window"] = None
  return hf


# ----------------------------------------------------------------------------------- layouts


def _identity(x, c):
  return x


def _t(x, c):
  return x.T


def _heads_in_to_ours(n_attr):
  def f(w, c):  # [(n h), d] -> [d, n, h]
    n = getattr(c, n_attr)
    return w.reshape(n, c.head_dim, w.shape[-1]).transpose(2, 0, 1)
  return f


def _heads_in_to_hf(k, c):  # [d, n, h] -> [(n h), d]
  return k.transpose(1, 2, 0).reshape(k.shape[1] * k.shape[2], k.shape[0])


def _bias_to_ours(n_attr):
  def f(b, c):
    return b.reshape(getattr(c, n_attr), c.head_dim)
  return f


def _bias_to_hf(b, c):
  return b.reshape(-1)


def _o_to_ours(w, c):  # [d, (n h)] -> [n, h, d]
  return w.reshape(w.shape[0], c.num_heads, c.head_dim).transpose(1, 2, 0)


def _o_to_hf(k, c):  # [n, h, d] -> [d, (n h)]
  return k.transpose(2, 0, 1).reshape(k.shape[2], k.shape[0] * k.shape[1])


Entry = tuple[tuple, str, Callable, Callable]  # (our path, hf name, to_ours, to_hf)


def param_mapping(config: ModelConfig) -> list[Entry]:
  """Every Decoder parameter: (state path, HF tensor name, HF->ours fn, ours->HF fn)."""
  c = config
  out: list[Entry] = [(("embed_tokens", "embedding"), "model.embed_tokens.weight",
                       _identity, _identity)]
  for i in range(c.num_layers):
    pre, hp = ("layers", i), f"model.layers.{i}."
    for name, n_attr in (("q_proj", "num_heads"), ("k_proj", "num_kv_heads"),
                         ("v_proj", "num_kv_heads")):
      out.append((pre + ("self_attn", name, "kernel"), hp + f"self_attn.{name}.weight",
                  _heads_in_to_ours(n_attr), _heads_in_to_hf))
      if c.qkv_bias:
        out.append((pre + ("self_attn", name, "bias"), hp + f"self_attn.{name}.bias",
                    _bias_to_ours(n_attr), _bias_to_hf))
    out.append((pre + ("self_attn", "o_proj", "kernel"), hp + "self_attn.o_proj.weight",
                _o_to_ours, _o_to_hf))
    if c.qk_norm:
      for name in ("q_norm", "k_norm"):
        out.append((pre + ("self_attn", name, "weight"), hp + f"self_attn.{name}.weight",
                    _identity, _identity))
    for name in ("gate_proj", "up_proj", "down_proj"):
      out.append((pre + ("mlp", name, "kernel"), hp + f"mlp.{name}.weight", _t, _t))
    for name in ("input_layernorm", "post_attention_layernorm"):
      out.append((pre + (name, "weight"), hp + f"{name}.weight", _identity, _identity))
  out.append((("norm", "weight"), "model.norm.weight", _identity, _identity))
  if not c.tie_embeddings:
    out.append((("lm_head", "kernel"), "lm_head.weight", _t, _t))
  return out


def _get_path(module, path: tuple):
  obj = module
  for key in path:
    obj = obj[key] if isinstance(key, int) else getattr(obj, key)
  return obj


# ----------------------------------------------------------------------------------- loading


def _weight_index(path: Path) -> dict[str, Path]:
  """HF tensor name -> safetensors file."""
  index = path / "model.safetensors.index.json"
  single = path / "model.safetensors"
  if index.exists():
    weight_map = json.loads(index.read_text())["weight_map"]
    files = {f: path / f for f in set(weight_map.values())}
    missing = sorted(str(f) for f in files.values() if not f.exists())
    if missing:
      raise FileNotFoundError(f"{index} lists weight files that do not exist: {missing}")
    return {name: files[f] for name, f in weight_map.items()}
  if single.exists():
    with safe_open(str(single), framework="numpy") as f:
      return {name: single for name in f.keys()}
  others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
  hint = f" (found {others}: only safetensors weights are supported)" if others else ""
  raise FileNotFoundError(
      f"no weights in {path}: expected model.safetensors or model.safetensors.index.json{hint}")


def _iter_tensors(entries, index: dict[str, Path]) -> Iterator[tuple[Entry, np.ndarray]]:
  """Yields (entry, numpy tensor) one at a time, keeping each file open once."""
  with contextlib.ExitStack() as stack:
    handles: dict[Path, Any] = {}
    for entry in entries:
      name = entry[1]
      if name not in index:
        raise KeyError(f"checkpoint is missing tensor {name!r}")
      file = index[name]
      if file not in handles:
        handles[file] = stack.enter_context(safe_open(str(file), framework="numpy"))
      yield entry, handles[file].get_tensor(name)


def from_pretrained(path: str | os.PathLike, *, mesh: jax.sharding.Mesh | None = None,
                    rules=None, dtype: str | None = None,
                    param_dtype: str | None = None,
                    remat: bool = False,
                    remat_policy: str = "full") -> tuple[Decoder, ModelConfig]:
  """Load a local Hugging Face checkpoint directory into a Decoder.

  Reads config.json and the safetensors weights (single file or sharded with an index) tensor by
  tensor: each is converted to our layout and dtype, placed on device (with its NamedSharding from
  `rules`, default DEFAULT_RULES, when `mesh` is given) and released, so the host never holds a
  second full copy of the model.

  Args:
    path: directory with config.json and model.safetensors[.index.json].
    mesh: optional mesh; parameters are created sharded by their logical axes.
    rules: logical-to-mesh rules (default `DEFAULT_RULES`).
    dtype: compute dtype ("float32" | "bfloat16"); default param_dtype.
    param_dtype: storage dtype; default the checkpoint's dtype (float16 -> float32).
    remat: activation checkpointing per block in training forwards (`ModelConfig.remat`).
    remat_policy: what a rematerialised block keeps (`ModelConfig.remat_policy`).

  Returns:
    (model, config).
  """
  path = Path(path)
  cfg_file = path / "config.json"
  if not path.is_dir():
    raise FileNotFoundError(f"checkpoint directory {path} does not exist")
  if not cfg_file.exists():
    raise FileNotFoundError(f"config.json not found in {path}")
  config = config_from_hf(json.loads(cfg_file.read_text()), dtype=dtype, param_dtype=param_dtype)
  config = config.replace(remat=bool(remat), remat_policy=remat_policy)
  index = _weight_index(path)
  rules = DEFAULT_RULES if rules is None else rules

  model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
  entries = param_mapping(config)
  np_dtype = np.dtype(DTYPES[config.param_dtype])
  for (our_path, name, to_ours, _), tensor in _iter_tensors(entries, index):
    var = _get_path(model, our_path)
    arr = to_ours(tensor, config)
    if tuple(arr.shape) != tuple(var.shape):
      raise ValueError(f"tensor {name!r} has shape {tensor.shape}, expected {var.shape} "
                       f"(after layout change) for {'.'.join(map(str, our_path))}")
    arr = np.asarray(arr, dtype=np_dtype)
    if mesh is None:
      value = jax.device_put(arr)
    else:
      axes = var.get_metadata().get("out_sharding") or (None,) * arr.ndim
      sharding = logical_sharding(mesh, axes, rules, arr.shape)
      value = jax.make_array_from_callback(arr.shape, sharding, lambda idx, a=arr: a[idx])
    var.set_value(value)
    del tensor, arr

  used = {e[1] for e in entries}
  if config.tie_embeddings:
    used.add("lm_head.weight")  # some tied checkpoints still store it
  extra = sorted(n for n in index if n not in used and not n.endswith(_IGNORED_SUFFIXES))
  if extra:
    raise UnsupportedCheckpointError(
        f"checkpoint has {len(extra)} tensors the model does not use, e.g. {extra[:5]}")
  return model, config


# ----------------------------------------------------------------------------------- saving


def save_pretrained(model: Decoder, config: ModelConfig, path: str | os.PathLike, *,
                    max_shard_bytes: int = 4 * 2**30) -> None:
  """Write config.json and safetensors weights that transformers' `from_pretrained` loads.

  Tensors are written in the model's parameter dtype. Weights above `max_shard_bytes` are split
  over `model-0000i-of-0000n.safetensors` files with `model.safetensors.index.json`; at most one
  shard is held on host at a time. A LoRA model must be merged first (`merge_lora`).

  Multi-host: every process must call this (each tensor is all-gathered across processes, a
  collective); only process 0 writes files, so `path` may be a shared or a local directory.
  """
  if any(hasattr(node, "lora_a") for _, node in nnx.iter_graph(model)):
    raise ValueError("model has LoRA adapters: call credit.models.merge_lora(model) first")
  path = Path(path)
  writer = jax.process_index() == 0
  if writer:
    path.mkdir(parents=True, exist_ok=True)

  # First pass sizes, to name files "-of-N" and keep one shard in memory at a time.
  entries = param_mapping(config)
  groups: list[list[Entry]] = [[]]
  acc = 0
  for e in entries:
    var = _get_path(model, e[0])
    nbytes = int(np.prod(var.shape)) * np.dtype(var[...].dtype).itemsize
    if groups[-1] and acc + nbytes > max_shard_bytes:
      groups.append([])
      acc = 0
    groups[-1].append(e)
    acc += nbytes

  metadata = {"format": "pt"}
  if len(groups) == 1:
    names = ["model.safetensors"]
  else:
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
  weight_map = {}
  total = 0
  for fname, group in zip(names, groups):
    tensors = {}
    for our_path, hf_name, _, to_hf in group:
      arr = to_host(_get_path(model, our_path)[...])
      tensors[hf_name] = np.ascontiguousarray(to_hf(arr, config))
      weight_map[hf_name] = fname
      total += tensors[hf_name].nbytes
    if writer:
      save_file(tensors, str(path / fname), metadata=metadata)
    del tensors
  if not writer:
    return
  if len(groups) > 1:
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
  (path / "config.json").write_text(json.dumps(config_to_hf(config), indent=2))
