"""The accelerator path: the sampler and one GRPO step at Qwen3-0.6B and 1.7B size.

One GRPO step, as the runner composes it from the same library pieces
(`credit.sampling.Sampler` on the mesh, `experiments.train.make_scorer`, the `grpo` estimator,
`experiments.train.make_update` with the `ppo_clip` loss and AdamW): N prompts of P random
tokens, G samples each of R new tokens (no stop token, so every row generates R), a reward
from the sampled tokens (parity of their sum: a cheap stand-in for a verifier), the
recomputed old log-probs, GRPO advantages and one PPO epoch over `--minibatches` minibatches.
Randomly initialised `credit.models.preset` weights; nothing is downloaded.

Printed per model (and written as a Markdown table with `--out`):

  sample s, tok/s      the sampler's wall time and generated tokens per second
  update s, tok/s      the update's wall time and trained tokens (B·T) per second
  step s               sample + reward + scoring + advantages + update
  MFU                  model FLOPs / (time · peak): per phase and for the step. Model FLOPs as in
                       `benchmarks/flops.py` (PaLM, arXiv:2204.02311, App. B): 2·N_mm + 4·L·H·Dh·T
                       per token forward (prefill, each decoded token at its context length,
                       scoring), 6·N_mm + 12·L·H·Dh·T per trained token. Peak: the device's
                       published dense peak for the compute dtype (`PEAK_TFLOPS`, by device kind)
                       and the matmul peak measured in this run (`--peak-n`), both shown.
  peak mem             the device's `peak_bytes_in_use` (GPU/TPU), else the process's max RSS;
                       beside it the memory plan of `experiments/memory.py` for this setting.

  python benchmarks/accelerator.py                      # GPU/TPU: qwen3-0.6b and qwen3-1.7b
  python benchmarks/accelerator.py --models qwen3-0.6b --prompts 16 --group 8 --new-tokens 256
  python benchmarks/accelerator.py --cpu-reduced        # the same code at a reduced size

On a CPU backend `--cpu-reduced` is chosen automatically (full size would take hours): the
presets' structure at width 64, 2 layers, a 512-token vocabulary and a batch of 2 x 4, so that
this script runs in CI (`tests/bench_accelerator_test.py`) and cannot rot.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import credit  # noqa: E402
from credit import parallel  # noqa: E402
from credit.models import ModelConfig, preset  # noqa: E402
from credit.sampling import Sampler  # noqa: E402
from experiments import memory, train  # noqa: E402
from experiments.producers.base import init_policy  # noqa: E402

# Dense peak TFLOP/s per chip by device kind substring, for bfloat16 and float32 compute (float32
# on NVIDIA without TF32; None: not published / not meaningful, the measured peak is used).
PEAK_TFLOPS = (
    ("H200", 989.0, 67.0), ("H100 PCIe", 756.0, 51.0), ("H100", 989.0, 67.0),
    ("A100", 312.0, 19.5), ("L4", 121.0, 30.3),
    ("TPU v6", 918.0, None), ("TPU v5p", 459.0, None), ("TPU v5", 197.0, None),
    ("TPU v4", 275.0, None),
)
REDUCED = dict(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
               head_dim=16, vocab_size=512)


@dataclasses.dataclass(frozen=True)
class Setting:
  """One measured configuration."""
  model: str = "qwen3-0.6b"      # a credit.models preset
  overrides: tuple = ()          # (field, value) pairs replacing preset fields
  prompts: int = 8               # N
  group: int = 8                 # G
  prompt_len: int = 64           # P
  new_tokens: int = 128          # R
  dtype: str = "bfloat16"        # parameters and compute (bfloat16: float32 master copy)
  remat: bool = True
  mesh: str = "fsdp=-1"
  minibatches: int = 1
  repeats: int = 2               # timed steps after the compiling one

  def config(self) -> ModelConfig:
    return preset(self.model, param_dtype=self.dtype, dtype=self.dtype, remat=self.remat,
                  **dict(self.overrides))


@dataclasses.dataclass
class Result:
  name: str
  sample_s: float
  update_s: float
  step_s: float
  compile_s: float
  sample_tok_s: float
  update_tok_s: float
  mfu: dict
  peak_mem: float
  mem_kind: str
  planned: float
  loss: float
  changed: bool
  tokens_sharding: str


def model_flops(cfg: ModelConfig, *, rows: int, prompt_len: int, new_tokens: int) -> dict:
  """Model FLOPs of one GRPO step's phases (see the module docstring)."""
  d, f, h, kv, dh, l = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                        cfg.num_kv_heads, cfg.head_dim, cfg.num_layers)
  n_mm = l * (2 * d * h * dh + 2 * d * kv * dh + 3 * d * f) + d * cfg.vocab_size
  t = prompt_len + new_tokens
  attn = 4 * l * h * dh
  prefill = rows * prompt_len * (2 * n_mm + attn * prompt_len)
  decode = rows * sum(2 * n_mm + attn * (prompt_len + i + 1) for i in range(new_tokens))
  score = rows * t * (2 * n_mm + attn * t)
  update = rows * t * (6 * n_mm + 3 * attn * t)
  return {"sample": prefill + decode, "score": score, "update": update}


def device_peak(dtype: str) -> tuple[float | None, str]:
  """(published dense peak FLOP/s of device 0 for `dtype`, its device kind); None if unknown."""
  kind = jax.devices()[0].device_kind
  for key, bf16, f32 in PEAK_TFLOPS:
    if key.lower() in kind.lower():
      peak = bf16 if dtype == "bfloat16" else f32
      return (None if peak is None else peak * 1e12), kind
  return None, kind


def matmul_peak(n: int, dtype: str, repeats: int = 3) -> float:
  """FLOP/s of an n×n by n×n matmul in `dtype` on device 0, median of `repeats`."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
  f = jax.jit(lambda x: x @ x)
  jax.block_until_ready(f(a))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(a))
    times.append(time.perf_counter() - t0)
  return 2 * n ** 3 / float(np.median(times))


def _peak_memory() -> tuple[float, str]:
  stats = None
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001 - backends without the call
    pass
  if stats and stats.get("peak_bytes_in_use"):
    return float(stats["peak_bytes_in_use"]), "device peak"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0, "process max RSS"


def build(s: Setting):
  """(cfg, mesh, sampler, step, state): `step(state, key) -> (state, metrics, times)` runs one
  GRPO step of setting `s` and reports each phase's wall time."""
  cfg = s.config()
  mesh = parallel.make_mesh(s.mesh)
  model = init_policy(cfg, mesh, seed=0)  # created sharded: each device draws its shard
  graphdef, params, rest = train.split_model(model)
  tx = train.make_optimizer(learning_rate=1e-5, total_steps=10, warmup_steps=0,
                            weight_decay=0.0, grad_clip=1.0,
                            master_dtype="float32" if s.dtype != "float32" else None)
  rep = parallel.replicated(mesh)
  p_sh, o_sh = train.state_shardings(tx, params, jax.eval_shape(tx.init, params), mesh)
  state = train.TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), rep),
                           params=jax.device_put(params, p_sh),
                           opt_state=jax.jit(tx.init, out_shardings=o_sh)(params),
                           key=jax.device_put(jax.random.key_data(jax.random.key(0)), rep))
  st_sh = train.TrainState(step=rep, params=p_sh, opt_state=o_sh, key=rep,
                           estimator_state=None, controller=None)
  sampler = Sampler(model, pad_id=0, stop_tokens=(), mesh=mesh)
  scorer = jax.jit(train.make_scorer(graphdef, rest, None, entropy=False))
  loss = credit.get_policy_loss("ppo_clip")
  terms = train.policy_terms(loss_spec=loss, loss_fields=tuple(sorted(loss.needs)),
                             loss_kwargs={}, kl_coef=0.0, kl_kind="k3", entropy_coef=0.0)
  update = jax.jit(train.make_update(graphdef, rest, tx, row_sets=[train.RowSet(
      train.MAIN, group_size=s.group)], terms=terms, ppo_epochs=1, num_minibatches=s.minibatches,
      chunk_size=None), out_shardings=(st_sh, rep), donate_argnums=(0,))
  grpo = credit.get_estimator("grpo").fn
  rows = s.prompts * s.group

  @jax.jit
  def reward_and_advantages(tokens, response_mask, group_id):
    reward = (jnp.sum(jnp.where(response_mask, tokens, 0), axis=1) % 2).astype(jnp.float32)
    adv = grpo(reward=reward, group_id=group_id, response_mask=response_mask,
               num_groups=s.prompts, group_size=s.group)
    return reward, adv

  prompts = np.asarray(jax.random.randint(jax.random.key(1), (s.prompts, s.prompt_len), 3,
                                          cfg.vocab_size), np.int32)
  prompt_mask = np.ones(prompts.shape, bool)

  def step(state, key):
    times = {}
    t0 = time.perf_counter()
    out = sampler(nnx.merge_state(state.params, rest), prompt_tokens=prompts,
                  prompt_mask=prompt_mask, key=key, max_new_tokens=s.new_tokens,
                  num_samples=s.group, temperature=1.0)
    jax.block_until_ready(out.tokens)
    times["sample"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    attn = jnp.arange(out.tokens.shape[1])[None, :] < out.lengths[:, None]
    logprob_old, _ = scorer(state.params, out.tokens, attn)
    reward, adv = reward_and_advantages(out.tokens, out.response_mask, out.group_id)
    jax.block_until_ready(adv)
    times["score"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    batch = {train.MAIN: {"tokens": out.tokens, "attn_mask": attn, "logprob_old": logprob_old,
                          "advantages": adv, "response_mask": out.response_mask}}
    state, metrics = update(state, batch)
    jax.block_until_ready(state.params)
    times["update"] = time.perf_counter() - t2
    times["step"] = time.perf_counter() - t0
    metrics = dict(metrics, reward_mean=jnp.mean(reward))
    return state, metrics, times, out

  assert rows % parallel.batch_divisor(mesh) == 0, "rows must split over the mesh's batch axes"
  return cfg, mesh, step, state


def run_setting(s: Setting, *, peak_n: int = 2048, out=print) -> Result:
  """Builds setting `s`, runs one compiling step and `s.repeats` timed steps; returns the
  medians and the derived rates."""
  cfg, mesh, step, state = build(s)
  before = np.asarray(jax.tree.leaves(state.params)[0], np.float32)  # the state is donated
  t0 = time.perf_counter()
  state, metrics, _, out_ = step(state, jax.random.key(10))
  compile_s = time.perf_counter() - t0
  changed = bool(np.any(np.asarray(jax.tree.leaves(state.params)[0], np.float32)
                        != before))
  times = []
  for i in range(s.repeats):
    state, metrics, t, out_ = step(state, jax.random.key(11 + i))
    times.append(t)
  med = {k: float(np.median([t[k] for t in times])) if times else float("nan")
         for k in ("sample", "score", "update", "step")}
  rows = s.prompts * s.group
  flops = model_flops(cfg, rows=rows, prompt_len=s.prompt_len, new_tokens=s.new_tokens)
  spec_peak, kind = device_peak(s.dtype)
  measured = matmul_peak(peak_n, s.dtype)
  n_dev = mesh.size
  mfu = {}
  for name, peak in (("spec", spec_peak), ("measured", measured)):
    if peak is None:
      continue
    total = peak * n_dev
    mfu[name] = {"sample": flops["sample"] / (med["sample"] * total),
                 "update": flops["update"] / (med["update"] * total),
                 "step": sum(flops.values()) / (med["step"] * total)}
  mem, mem_kind = _peak_memory()
  plan = memory.plan_memory(model=cfg, mesh_shape=dict(mesh.shape), rollout_rows=rows,
                            seq_len=s.prompt_len + s.new_tokens, num_minibatches=s.minibatches,
                            master_dtype="float32" if s.dtype != "float32" else None)
  spec = getattr(out_.tokens.sharding, "spec", None)
  name = s.model + ("" if not s.overrides else " (" + ", ".join(
      f"{k}={v}" for k, v in s.overrides if k not in REDUCED or dict(s.overrides) != REDUCED)
      + ")") if dict(s.overrides) != REDUCED else s.model + " (reduced)"
  return Result(name=name, sample_s=med["sample"], update_s=med["update"], step_s=med["step"],
                compile_s=compile_s, sample_tok_s=rows * s.new_tokens / med["sample"],
                update_tok_s=rows * (s.prompt_len + s.new_tokens) / med["update"], mfu=mfu,
                peak_mem=mem, mem_kind=mem_kind, planned=plan.peak,
                loss=float(metrics["loss"]), changed=changed, tokens_sharding=str(spec))


def table(results: list[Result], s: Setting) -> str:
  """The results as a Markdown table."""
  kind = jax.devices()[0].device_kind
  head = (f"device: {jax.device_count()} x {kind} ({jax.default_backend()}), mesh {s.mesh}, "
          f"{s.dtype}, remat={s.remat}; N={s.prompts} prompts x G={s.group}, P={s.prompt_len}, "
          f"R={s.new_tokens}, {s.minibatches} minibatch(es); load {os.getloadavg()[0]:.1f}")
  lines = [head, "",
           "| model | sample s | sample tok/s | update s | update tok/s | step s | "
           "MFU step (spec / measured peak) | MFU sample | MFU update | peak mem GiB "
           "| plan GiB | first step s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in results:
    def pct(phase):
      return " / ".join(f"{r.mfu[k][phase]:.1%}" for k in ("spec", "measured") if k in r.mfu)
    lines.append(f"| {r.name} | {r.sample_s:.3f} | {r.sample_tok_s:,.0f} | {r.update_s:.3f} | "
                 f"{r.update_tok_s:,.0f} | {r.step_s:.3f} | {pct('step')} | {pct('sample')} | "
                 f"{pct('update')} | {r.peak_mem / memory.GIB:.2f} ({r.mem_kind}) | "
                 f"{r.planned / memory.GIB:.2f} | {r.compile_s:.1f} |")
  return "\n".join(lines)


def main(argv=None) -> list[Result]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--models", default="",
                 help="comma-separated presets (default qwen3-0.6b,qwen3-1.7b; reduced: the first)")
  p.add_argument("--prompts", type=int, default=8)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--new-tokens", type=int, default=128)
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--no-remat", action="store_true")
  p.add_argument("--mesh", default="fsdp=-1")
  p.add_argument("--minibatches", type=int, default=1)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--peak-n", type=int, default=4096)
  p.add_argument("--cpu-reduced", action="store_true",
                 help="the reduced size (automatic on a CPU backend)")
  p.add_argument("--full", action="store_true", help="full size even on a CPU backend")
  p.add_argument("--out", default="", help="also write the table to this Markdown file")
  a = p.parse_args(argv)
  reduced = a.cpu_reduced or (jax.default_backend() == "cpu" and not a.full)
  s = Setting(prompts=a.prompts, group=a.group, prompt_len=a.prompt_len,
              new_tokens=a.new_tokens, dtype=a.dtype, remat=not a.no_remat, mesh=a.mesh,
              minibatches=a.minibatches, repeats=a.repeats)
  peak_n = a.peak_n
  if reduced:
    s = dataclasses.replace(s, overrides=tuple(REDUCED.items()), prompts=2, group=4,
                            prompt_len=8, new_tokens=8, dtype="float32",
                            repeats=min(a.repeats, 1))
    peak_n = min(peak_n, 256)
    print("reduced mode (CPU backend or --cpu-reduced): the presets' structure at "
          f"{dict(REDUCED)}; pass --full for the real size")
  models = a.models or ("qwen3-0.6b" if reduced else "qwen3-0.6b,qwen3-1.7b")
  results = []
  for name in models.split(","):
    r = run_setting(dataclasses.replace(s, model=name.strip()), peak_n=peak_n)
    results.append(r)
    print(table([r], s).splitlines()[-1], flush=True)
  text = table(results, s)
  print(text)
  if a.out:
    with open(a.out, "w", encoding="utf-8") as fh:
      fh.write(text + "\n")
  return results


if __name__ == "__main__":
  main()
