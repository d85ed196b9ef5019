"""Decode step time against KV-cache capacity: does a step cost the filled length or the buffer?

The sampler's cache is allocated once for the longest sequence it may hold (prompt + new tokens,
or a whole multi-turn episode), so most decode steps run with a cache that is partly empty. This
script prefills B prompts of P tokens into caches of c x (P + N) slots for c in `--capacity`
(1 = exactly what the N new tokens need), then times the jitted `credit.sampling.decode` loop of
the same N steps (the same tokens: same key) on each. Prefill and compiles are excluded. The
capacities are run interleaved, `--repeats` rounds, so that a change of machine load hits them
alike; the table gives the median per-step wall time and process CPU time and the ratio of each
capacity against 1x measured in the same run (target: 4x <= 1.15x). As in
`benchmarks/estimators.py`, the process is pinned to one core before XLA starts (`--all-cores` to
keep them all), so that the CPU column is the single-thread work whatever the machine's load.

Two models by default: `tiny` (character vocabulary, hidden 128, 2 layers, head dim 32: the
built-in recipes' policies and `benchmarks/multiturn.py`) and `small` (vocab 32000, hidden 256,
4 layers, 4 heads / 2 kv heads, head dim 64: `benchmarks/sampling.py`'s shape).

  python benchmarks/decode.py [--models tiny,small] [--batch 32] [--prompt 16] [--new 128]
                              [--capacity 1,2,4] [--repeats 5] [--all-cores]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from credit import sampling
from credit.models import Decoder
from credit.models.config import tiny_config
from credit.tasks import CharTokenizer

MODELS = {
    "tiny": dict(vocab_size=CharTokenizer().vocab_size, hidden_size=128, intermediate_size=384,
                 num_layers=2, head_dim=32),
    "small": dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_layers=4,
                  num_heads=4, num_kv_heads=2, head_dim=64),
}


def _programs(model, B: int, P: int, N: int):
  """Jitted (prefill at a given cache width, decode of N steps); the model enters as a pytree."""
  graphdef, _ = nnx.split(model)
  params = sampling.sampling_params(temperature=1.0, vocab_size=model.config.vocab_size)

  def start(state, tokens, mask, key, *, width):
    m = nnx.merge(graphdef, state)
    return sampling.prefill(m, prompt_tokens=tokens, prompt_mask=mask, key=key,
                            max_new_tokens=width - P, max_new_B=jnp.full((B,), N, jnp.int32),
                            params=params)

  def run(state, s):
    return sampling.decode(nnx.merge(graphdef, state), s, params, max_new_tokens=N)

  # The decode loop takes the prefilled state donated, as a sampler that prefills and decodes in
  # one program does: otherwise every call would first copy the whole cache (a cost in the
  # capacity that no decode step pays).
  return jax.jit(start, static_argnames="width"), jax.jit(run, donate_argnums=1)


def bench_model(name: str, a) -> list[tuple]:
  cfg = tiny_config("qwen3", **MODELS[name])
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  state = nnx.state(model)
  B, P, N = a.batch, a.prompt, a.new
  rng = np.random.RandomState(0)
  tokens = rng.randint(3, cfg.vocab_size, (B, P)).astype(np.int32)
  mask = np.ones((B, P), bool)
  mask[:, :P // 4] = False  # some left padding, as real prompts have
  key = jax.random.key(0)
  start, run = _programs(model, B, P, N)
  caps = [int(c) for c in a.capacity.split(",")]

  def prefilled(c):
    return jax.block_until_ready(start(state, tokens, mask, key, width=c * (P + N)))

  for c in caps:  # compiles
    jax.block_until_ready(run(state, prefilled(c)))
  wall = {c: [] for c in caps}
  cpu = {c: [] for c in caps}
  for _ in range(a.repeats):
    for c in caps:
      s = prefilled(c)
      w0, c0 = time.perf_counter(), time.process_time()
      out = jax.block_until_ready(run(state, s))
      wall[c].append((time.perf_counter() - w0) / N)
      cpu[c].append((time.process_time() - c0) / N)
      assert int(out.step) == N
  base_w, base_c = statistics.median(wall[caps[0]]), statistics.median(cpu[caps[0]])
  rows = []
  for c in caps:
    w, u = statistics.median(wall[c]), statistics.median(cpu[c])
    rows.append((name, c, c * (P + N), w * 1e3, min(wall[c]) * 1e3, u * 1e3, w / base_w,
                 u / base_c))
  return rows


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--models", default="tiny,small")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--capacity", default="1,2,4")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--all-cores", action="store_true",
                  help="do not pin the process to one core (see the module docstring)")
  a = ap.parse_args()
  if not a.all_cores and hasattr(os, "sched_setaffinity"):  # before XLA's thread pool starts
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
  rows = []
  for name in a.models.split(","):
    rows += bench_model(name, a)
  load = os.getloadavg()
  print(f"B={a.batch} P={a.prompt} N={a.new}; jax {jax.__version__}, "
        f"{jax.devices()[0].platform}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"median of {a.repeats} interleaved rounds")
  print("| model | capacity | cache slots | step ms (median) | step ms (best) | CPU ms/step | "
        "wall vs 1x | CPU vs 1x |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for name, c, s, w, best, u, rw, rc in rows:
    print(f"| {name} | {c}x | {s} | {w:.3f} | {best:.3f} | {u:.3f} | {rw:.2f}x | {rc:.2f}x |")


if __name__ == "__main__":
  main()
