"""A run's memory plan per device, computed from shapes before anything is built or compiled.

`plan_memory` is a pure function of the model's `ModelConfig`, the batch and sequence sizes, the
mesh's axis sizes and the device's memory; `plan_run` reads those from an experiment config,
`format_plan` prints the table, and `check_fits` refuses a plan that does not fit (called by
`experiments/validate.py` when the mesh is made, before the loop builds anything).

Per device, in bytes (each array divided by the mesh axes its logical axes map to under
`credit.models.DEFAULT_RULES`, as `shard_model` places it; rows divided by the batch axes):

* parameters: every decoder array (`param_shapes`), in `param_dtype`;
* optimiser: AdamW's two moments in the parameters' dtype, or with a float32 master copy
  (`train.with_master_copy`) the copy and both moments in float32; LoRA: adapters only;
* gradients: one parameter-sized tree in `param_dtype` (float32 for the unembedding, which the
  chunked scorer accumulates in float32);
* activations of the update at its micro-batch (rows / num_minibatches / batch axes), T
  positions, per layer and token: the block's saved tensors 4D + 2(N+K)H + 3F in the compute
  dtype plus the float32 attention probabilities N·T; with remat only the block input D per
  layer plus one layer's set; plus the scorer's float32 logit chunk (3·256 rows·V);
* sampler: the KV cache 2·L·K·H·T per row in the compute dtype, plus float32 logits per row;
* scoring passes without gradient (old log-probs, reference): one layer's activations over the
  whole batch plus the logit chunk;
* the reference copy, a frozen teacher, a lagged self-teacher (parameters only) and trained
  field producers (critic, implicit PRM: parameters, optimiser and gradients each).

Peak = what stays resident (parameters, optimiser, copies) + the largest phase (update:
gradients + activations; sampling; scoring). The plan is an estimate: XLA's fusion, buffer
reuse and workspace move the real number (the accelerator benchmark prints both); a run is
refused only when the peak exceeds `USABLE` of the device's memory.
"""
from __future__ import annotations

import dataclasses
import math
import os
import types
from typing import Any, Mapping

import jax.numpy as jnp

from credit.models.config import DTYPES, ModelConfig
from credit.models.sharding import DEFAULT_RULES, logical_to_mesh_axes

GIB = float(2 ** 30)
USABLE = 0.9          # share of a device's memory a plan may fill (XLA workspace, fragmentation)
LOGIT_ROWS = 256      # rows of one scoring chunk (credit.scoring's ROWS_PER_CHUNK)
LOGIT_COPIES = 3      # float32 [rows, V] arrays live at once in a chunk (logits, exp, gradient)
BATCH_AXES = ("data", "fsdp")


def _bytes(dtype: str) -> int:
  return jnp.dtype(DTYPES[dtype]).itemsize


def param_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], tuple[str | None, ...]]]:
  """(name, shape, logical axes) of every parameter of `credit.models.Decoder(cfg)` (one
  entry per layer's array), the layout of `decoder.py`."""
  d, f, n, k, h, v = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                      cfg.head_dim, cfg.vocab_size)
  out = [("embed_tokens", (v, d), ("vocab", "embed"))]
  for i in range(cfg.num_layers):
    p = f"layers.{i}."
    out += [(p + "q_proj", (d, n, h), ("embed", "q_heads", "head_dim")),
            (p + "k_proj", (d, k, h), ("embed", "kv_heads", "head_dim")),
            (p + "v_proj", (d, k, h), ("embed", "kv_heads", "head_dim")),
            (p + "o_proj", (n, h, d), ("q_heads", "head_dim", "embed")),
            (p + "gate_proj", (d, f), ("embed", "mlp")),
            (p + "up_proj", (d, f), ("embed", "mlp")),
            (p + "down_proj", (f, d), ("mlp", "embed")),
            (p + "input_layernorm", (d,), ("norm",)),
            (p + "post_attention_layernorm", (d,), ("norm",))]
    if cfg.qkv_bias:
      out += [(p + "q_bias", (n, h), ("q_heads", "head_dim")),
              (p + "k_bias", (k, h), ("kv_heads", "head_dim")),
              (p + "v_bias", (k, h), ("kv_heads", "head_dim"))]
    if cfg.qk_norm:
      out += [(p + "q_norm", (h,), ("head_dim",)), (p + "k_norm", (h,), ("head_dim",))]
  out.append(("norm", (d,), ("norm",)))
  if not cfg.tie_embeddings:
    out.append(("lm_head", (d, v), ("embed", "vocab")))
  return out


def num_params(cfg: ModelConfig) -> int:
  """Parameters of `Decoder(cfg)` (a tied embedding counted once)."""
  return sum(math.prod(s) for _, s, _ in param_shapes(cfg))


def _shard_factor(shape, axes, mesh_shape: Mapping[str, int], rules=DEFAULT_RULES) -> int:
  """How many ways an array is split on a mesh of `mesh_shape` (the rules of `shard_model`)."""
  spec = logical_to_mesh_axes(axes, types.SimpleNamespace(shape=dict(mesh_shape)), rules, shape)
  factor = 1
  for entry in spec:
    for a in (entry if isinstance(entry, tuple) else (entry,)):
      if a is not None:
        factor *= mesh_shape[a]
  return factor


def params_per_device(cfg: ModelConfig, mesh_shape: Mapping[str, int]) -> float:
  """Parameter elements one device holds (the largest shard of each array, rounded up)."""
  return float(sum(math.ceil(math.prod(s) / _shard_factor(s, a, mesh_shape))
                   for _, s, a in param_shapes(cfg)))


def _unembed_per_device(cfg: ModelConfig, mesh_shape: Mapping[str, int]) -> float:
  shape = (cfg.hidden_size, cfg.vocab_size)
  return math.ceil(math.prod(shape) / _shard_factor(shape, ("embed", "vocab"), mesh_shape))


def lora_params(cfg: ModelConfig, rank: int, targets) -> int:
  """Adapter parameters of `apply_lora(rank, targets)`: rank·(in + out) per adapted matrix."""
  d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim)
  size = {"q_proj": (d, n * h), "k_proj": (d, k * h), "v_proj": (d, k * h),
          "o_proj": (n * h, d), "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}
  return cfg.num_layers * sum(rank * sum(size[t]) for t in targets if t in size)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes per device of each part of a run, and whether the peak fits.

  rows: (name, bytes per device, phase) with phase "resident" (held the whole run) or the
    transient phase it belongs to ("update", "sampling", "scoring").
  peak: resident + the largest phase. available: the device's memory in bytes (None: unknown,
    nothing is refused). usable: USABLE · available. mesh: the axis sizes. notes: the sizes
    the plan assumed (rows, micro-batch, positions, remat, dtypes).
  """
  rows: tuple
  peak: float
  available: float | None
  mesh: tuple
  notes: str
  advice: tuple = ()

  @property
  def usable(self) -> float | None:
    return None if self.available is None else USABLE * self.available

  @property
  def fits(self) -> bool:
    return self.available is None or self.peak <= self.usable

  def phase(self, name: str) -> float:
    return sum(b for _, b, p in self.rows if p == name)


def plan_memory(*, model: ModelConfig, mesh_shape: Mapping[str, int], rollout_rows: int,
                seq_len: int, num_minibatches: int = 1, master_dtype: str | None = None,
                lora: int = 0, reference: ModelConfig | None = None,
                teacher: ModelConfig | None = None, lagged_copy: bool = False,
                trained_copies: int = 0, device_bytes: float | None = None) -> MemoryPlan:
  """The memory plan of one RL run per device (see the module docstring for what is counted).

  Args:
    model: the policy (its `param_dtype`, `dtype` and `remat` included).
    mesh_shape: {axis: size}, e.g. {"data": 2, "fsdp": 4}; rows split over data x fsdp.
    rollout_rows: B, rows of one step's batch (N·G, or a tree's rows).
    seq_len: T, prompt + response positions of a row (the KV cache's slots).
    num_minibatches: optimiser steps per epoch (the update's micro-batch is B / this).
    master_dtype: "float32" for a float32 master copy of narrower parameters, else None.
    lora: trainable adapter parameters (0: the whole model trains).
    reference: the frozen reference's config (None: no reference copy).
    teacher: a frozen teacher's config (None: none).
    lagged_copy: a lagged self-teacher copy of the policy is kept.
    trained_copies: field producers that train their own copy of the policy (critic, PRM).
    device_bytes: one device's memory (None: unknown; the plan then refuses nothing).

  Returns:
    A `MemoryPlan`.
  """
  mesh_shape = {a: int(s) for a, s in mesh_shape.items()}
  div = math.prod(mesh_shape.get(a, 1) for a in BATCH_AXES)
  tensor = mesh_shape.get("tensor", 1)
  pb, cb = _bytes(model.param_dtype), _bytes(model.dtype)
  n_dev = params_per_device(model, mesh_shape)
  frac = n_dev / max(num_params(model), 1)  # the share of any parameter tree a device holds
  trainable = lora * frac if lora else n_dev
  narrow = master_dtype is not None and pb < _bytes(master_dtype)
  opt = trainable * (3 * _bytes(master_dtype) if narrow else 2 * pb)
  unembed = _unembed_per_device(model, mesh_shape) if not lora else 0
  grads = trainable * pb + unembed * (4 - pb) if not lora else trainable * pb

  d, f, n, k, h, v, layers = (model.hidden_size, model.intermediate_size, model.num_heads,
                              model.num_kv_heads, model.head_dim, model.vocab_size,
                              model.num_layers)
  t = seq_len
  n_loc = n // tensor if n % tensor == 0 else n  # heads split over the tensor axis
  k_loc = k // tensor if k % tensor == 0 else k
  per_layer = (4 * d + 2 * (n_loc + k_loc) * h + 3 * f) * cb + 4 * n_loc * t  # per token
  micro = max(math.ceil(rollout_rows / max(num_minibatches, 1) / div), 1)
  rows_dev = max(math.ceil(rollout_rows / div), 1)
  if model.remat and model.remat_policy == "projections":  # + the weight matmuls' outputs
    kept = layers * (d + 2 * d + (n_loc + 2 * k_loc) * h + 2 * f) * cb + per_layer
  elif model.remat:
    kept = layers * d * cb + per_layer
  else:
    kept = layers * per_layer
  logits = LOGIT_COPIES * min(LOGIT_ROWS, micro * t) * v * 4
  acts = micro * t * (kept + d * 4) + logits
  cache = 2 * layers * rows_dev * k_loc * h * t * cb + rows_dev * v * 4 * LOGIT_COPIES
  score = rows_dev * t * (per_layer + d * 4) + LOGIT_COPIES * min(LOGIT_ROWS, rows_dev * t) * v * 4

  rows = [("parameters", n_dev * pb, "resident"),
          ("optimiser state" + (" (float32 master + moments)" if narrow else ""), opt,
           "resident")]
  if reference is not None:
    rows.append(("reference copy", params_per_device(reference, mesh_shape)
                 * _bytes(reference.param_dtype), "resident"))
  if teacher is not None:
    rows.append(("teacher", params_per_device(teacher, mesh_shape) * _bytes(teacher.param_dtype),
                 "resident"))
  if lagged_copy:
    rows.append(("lagged self-teacher copy", n_dev * pb, "resident"))
  if trained_copies:
    rows.append((f"trained producers ({trained_copies}: params, optimiser)",
                 trained_copies * n_dev * (pb + 2 * pb), "resident"))
    rows.append(("their gradients", n_dev * pb, "update"))
  rows += [("gradients", grads, "update"),
           (f"activations ({micro} rows x {t}"
            f"{f', remat {model.remat_policy}' if model.remat else ''})", acts,
            "update"),
           (f"sampler KV cache ({rows_dev} rows x {t} slots) + logits", cache, "sampling"),
           (f"scoring pass without gradient ({rows_dev} rows)", score, "scoring")]
  resident = sum(b for _, b, p in rows if p == "resident")
  phases = {p for _, _, p in rows if p != "resident"}
  peak = resident + max(sum(b for _, b, q in rows if q == p) for p in phases)
  notes = (f"{_count(num_params(model))} params ({model.param_dtype}, compute "
           f"{model.dtype}), mesh {mesh_shape}, B={rollout_rows}, T={t}, "
           f"{num_minibatches} minibatches")
  # The remedies of the larger part first: what stays resident, or the largest phase.
  resident = sum(b for _, b, p in rows if p == "resident")
  weights = []
  if mesh_shape.get("fsdp", 1) * tensor < math.prod(mesh_shape.values()):
    weights.append((resident, "shard the parameters over every device (--config.mesh=fsdp=-1)"))
  if model.param_dtype == "float32" or model.dtype == "float32":
    weights.append((resident, "store and compute in bfloat16 (--config.model.param_dtype="
                              "bfloat16 --config.model.compute_dtype=bfloat16 "
                              "--config.model.optimizer_dtype=float32)"))
  if not model.remat:
    weights.append((acts, "turn on --config.model.remat=True"))
  elif model.remat_policy != "full":
    weights.append((acts, "keep only block inputs (--config.model.remat_policy=full)"))
  weights.append((0.5 * (peak - resident), "use more --config.num_minibatches or fewer rows or "
                                   "positions"))
  advice = [text for _, text in sorted(weights, key=lambda w: -w[0])]
  return MemoryPlan(tuple(rows), float(peak), device_bytes,
                    tuple(sorted(mesh_shape.items())), notes, tuple(advice))


def _count(n: int) -> str:
  """A parameter count as people write it: 12.8k, 596M, 1.72B."""
  for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
    if n >= scale:
      return f"{n / scale:.3g}{unit}"
  return str(n)


def format_plan(plan: MemoryPlan) -> str:
  """The plan as a Markdown table (GiB per device), one line of totals under it."""
  lines = [f"memory plan per device: {plan.notes}", "",
           "| part | phase | GiB per device |", "|---|---|---:|"]
  lines += [f"| {name} | {phase} | {b / GIB:.3f} |" for name, b, phase in plan.rows]
  if plan.available is None:
    tail = "device memory unknown (nothing refused)"
  else:
    tail = (f"of {plan.available / GIB:.2f} GiB ({USABLE:.0%} usable: "
            f"{plan.usable / GIB:.2f}): {'fits' if plan.fits else 'DOES NOT FIT'}")
  lines += ["", f"peak {plan.peak / GIB:.3f} GiB (resident + the largest phase) {tail}"]
  return "\n".join(lines)


def refusal(plan: MemoryPlan) -> str | None:
  """None if the plan fits; else one line `<what> <why>; <what to do>` with its numbers."""
  if plan.fits:
    return None
  parts = ", ".join(f"{name.split(' (')[0]} {b / GIB:.2f}" for name, b, _ in plan.rows)
  return (f"the run needs {plan.peak / GIB:.2f} GiB per device ({parts} GiB; {plan.notes}) "
          f"but a device has {plan.available / GIB:.2f} GiB ({USABLE:.0%} usable); "
          + ", or ".join(plan.advice))


# --------------------------------------------------------------------------
# From an experiment config.
# --------------------------------------------------------------------------


def device_memory(c=None, device=None) -> float | None:
  """One device's memory in bytes: `c.memory.device_gb` when set (> 0); else the device's
  `memory_stats()["bytes_limit"]` (GPU, TPU); else the host's available memory divided among
  its local devices (CPU); None when none of these is known."""
  import jax
  gb = float(c.get("memory", {}).get("device_gb", 0.0)) if c is not None else 0.0
  if gb > 0:
    return gb * GIB
  device = device or jax.local_devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 - backends without the call
    stats = None
  if stats and stats.get("bytes_limit"):
    return float(stats["bytes_limit"])
  try:
    with open("/proc/meminfo", encoding="utf-8") as fh:
      info = dict(line.split(":", 1) for line in fh)
    avail = float(info["MemAvailable"].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    try:
      avail = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
      return None
  return avail / max(jax.local_device_count(), 1)


def _checkpoint_config(path: str, param_dtype: str | None, dtype: str | None,
                       remat: bool = False, remat_policy: str = "full") -> ModelConfig | None:
  """The `ModelConfig` of a local HF checkpoint's config.json (None if it cannot be read;
  the loop reports that)."""
  import json

  from credit.models.hf_io import UnsupportedCheckpointError, config_from_hf
  try:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
      cfg = config_from_hf(json.load(fh), param_dtype=param_dtype, dtype=dtype)
  except (OSError, ValueError, KeyError, UnsupportedCheckpointError):
    return None
  return cfg.replace(remat=bool(remat), remat_policy=remat_policy)


def policy_config(c) -> ModelConfig | None:
  """The policy's `ModelConfig` under experiment config `c`, from shapes alone: the
  checkpoint's config.json (init_from, warm_start_from) or `producers.model_config` with the
  character tokenizer (from-scratch runs); None when a checkpoint cannot be read."""
  from credit import tasks as tasks_lib
  from experiments.producers.base import model_config
  source = c.get("init_from", "") or c.get("warm_start_from", "")
  if source:
    return _checkpoint_config(source, c.model.param_dtype, c.model.compute_dtype,
                              c.model.remat, c.model.get("remat_policy", "full"))
  return model_config(c, tasks_lib.CharTokenizer())


def prompt_tokens(c) -> int:
  """Prompt positions to plan for: `c.memory.prompt_tokens`, else the longest of up to 64
  sampled task prompts (JSON-lines: every line) in characters, + 2 (bos, separator), + the
  prompt template, system prompt and 64 positions of chat template with a checkpoint's
  tokenizer (one token per character bounds a byte-level BPE's count of ASCII text)."""
  import json

  import numpy as np

  from credit import tasks as tasks_lib
  fixed = int(c.get("memory", {}).get("prompt_tokens", 0))
  if fixed:
    return fixed
  longest = 64
  try:
    if c.task == "jsonl" and c.data_path and os.path.isfile(c.data_path):
      with open(c.data_path, encoding="utf-8") as fh:
        texts = [str(json.loads(line).get(c.prompt_field) or
                     json.loads(line).get("question") or json.loads(line).get("problem") or "")
                 for line in fh if line.strip()]
      longest = max((len(t) for t in texts), default=longest)
    elif c.task not in ("jsonl", "tfds"):
      task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
      examples = task.generate(np.random.default_rng(c.seed), min(64, c.num_train_examples))
      longest = max(len(str(e["prompt"])) for e in examples)
  except Exception:  # noqa: BLE001 - the data checks report a task or file that fails
    pass
  extra = 2
  if c.get("init_from", ""):
    extra += 64 + len(c.get("system_prompt", "")) + len(c.get("prompt_template", ""))
  return longest + extra


def plan_run(c, *, method, reference_copy: bool, mesh_shape: Mapping[str, int],
             device_bytes: float | None = None, model: ModelConfig | None = None,
             seq_len: int | None = None) -> MemoryPlan | None:
  """`plan_memory` for experiment config `c` on a mesh of `mesh_shape`: the policy (`model`,
  default `policy_config(c)`), the step's rows, T = `seq_len` (default `prompt_tokens(c)` +
  max_new_tokens), the minibatches, the float32 master copy, LoRA, and the copies the
  planned producers keep (reference, teacher, lagged self-teacher, trained producers).
  `method` is the run's resolved method (`loop.check_method(c)`, for its producers) and
  `reference_copy` whether it keeps a frozen reference copy of the policy.
  None when the policy's shapes cannot be read (the loop then reports why)."""
  from experiments.producers.rollouts import rollout_rows
  model = model or policy_config(c)
  if model is None:
    return None
  reference = model if reference_copy else None
  teacher = None
  if c.teacher.init_from:
    teacher = _checkpoint_config(c.teacher.init_from, c.teacher.param_dtype,
                                 c.teacher.compute_dtype)
  names = {p.producer.name for p in method.plan}
  lagged = bool(c.teacher.lag) and "self_teacher_pass" in names
  trained = sum(1 for p in method.plan if p.producer.init is not None)
  opt_dtype = c.model.get("optimizer_dtype", "param")
  return plan_memory(
      model=model, mesh_shape=mesh_shape, rollout_rows=rollout_rows(c),
      seq_len=seq_len or prompt_tokens(c) + c.max_new_tokens,
      num_minibatches=c.num_minibatches,
      master_dtype=None if opt_dtype == "param" else opt_dtype,
      lora=lora_params(model, c.lora_rank, tuple(c.lora_targets)) if c.lora_rank else 0,
      reference=reference, teacher=teacher, lagged_copy=lagged, trained_copies=trained,
      device_bytes=device_bytes)
