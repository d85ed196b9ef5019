"""Peak memory and time of chunked vs full-logits per-token scoring (log-prob + entropy).

    python benchmarks/scoring.py [--B 4] [--T 1024] [--V 151936] [--D 896]
                                 [--chunk-sizes auto,32,128] [--vocab-chunk-size 0]
                                 [--modes fwd,fwdbwd] [--repeats 3] [--dtype float32]
                                 [--no-rss] [--no-time] [--system-malloc]

Defaults mimic Qwen2.5-0.5B's head (D = 896, V = 151,936) on a batch of 4 × 1024 tokens.
"naive" is ``log_softmax(h @ W)`` gathered plus ``−Σ p log p`` (the [B,T,V] float32 logits
exist); "chunked c=N" is `credit.scoring.token_logprobs_and_entropy(chunk_size=N)` and
"chunked auto" the default `chunk_size=None` (`auto_chunk_size`: 256 // B positions).

Modes: "fwd" returns (logprob, entropy); "fwdbwd" is value_and_grad of
``Σ A·logprob + 0.01·Σ entropy`` w.r.t. hidden and unembedding (a policy-gradient loss with an
entropy bonus).

Columns:
  call MB            XLA's compiled memory_analysis(): temp + output buffers, what one call
                     allocates on top of its inputs (the inputs, h and W, are the same arrays
                     for every implementation and exist before and after the call).
  peak MB            temp + arguments + outputs − aliased: the whole footprint including the
                     inputs. Its ratio has a floor of args/(args + naive call) that no
                     implementation can beat (W alone is 544 MB at D=896, V=151,936).
  RSS MB             measured: a fresh child process (glibc's default malloc, so freed memory
                     leaves the resident set) builds the inputs, compiles the function, resets
                     its peak-RSS counter (/proc/self/clear_refs), runs it once, and reports
                     VmHWM − VmRSS-before-the-run: the extra memory of one call (outputs and
                     temporaries, not inputs or compiler). Off with --no-rss.
  ms                 median wall time of --repeats calls after one warm-up; implementations
                     are interleaved call by call so machine load hits all of them alike.
  x naive            ratio to the naive row of the same mode, measured in this run.

Allocator (benchmarks/_malloc.py): glibc is told to keep freed blocks (no mmap per large
temporary) unless --system-malloc; otherwise every call of the naive path pays page faults on
GBs of fresh mappings, which flatters the chunked path.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _malloc import tune_unless_asked_not_to  # noqa: E402

_MALLOC_TUNED = tune_unless_asked_not_to(__name__ == "__main__")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from credit import scoring  # noqa: E402


def naive_scores(h_BTD, w_DV, tokens_BT):
  """Full-logits reference: materialises [B,T,V] float32."""
  logits = jnp.einsum("btd,dv->btv", h_BTD, w_DV, preferred_element_type=jnp.float32)
  lp = jax.nn.log_softmax(logits, axis=-1)
  tok_lp = jnp.take_along_axis(lp, tokens_BT[..., None], axis=-1)[..., 0]
  return tok_lp, -jnp.sum(jnp.exp(lp) * lp, axis=-1)


def _impl(name: str, vocab_chunk: int | None):
  if name == "naive":
    return naive_scores
  c = None if name == "chunked auto" else int(name.split("=")[1])
  return lambda h, w, y: tuple(scoring.token_logprobs_and_entropy(
      h, w, y, chunk_size=c, vocab_chunk_size=vocab_chunk))


def _function(name: str, mode: str, vocab_chunk: int | None):
  fn = _impl(name, vocab_chunk)
  if mode == "fwd":
    return jax.jit(fn)

  def loss(h, w, y, adv):
    lp, ent = fn(h, w, y)
    return jnp.sum(adv * lp) + 0.01 * jnp.sum(ent)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _inputs(b, t, v, d, dtype):
  k = jax.random.split(jax.random.PRNGKey(0), 4)
  h = jax.random.normal(k[0], (b, t, d), jnp.float32).astype(dtype)
  w = (jax.random.normal(k[1], (d, v), jnp.float32) / np.sqrt(d)).astype(dtype)
  y = jax.random.randint(k[2], (b, t), 0, v)
  adv = jax.random.normal(k[3], (b, t), jnp.float32)
  return h, w, y, adv


def _args(mode, h, w, y, adv):
  return (h, w, y) if mode == "fwd" else (h, w, y, adv)


def _status_mb(key: str) -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(key + ":"):
        return int(line.split()[1]) / 1024
  return float("nan")


def _mem_available_mb() -> float:
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def _child(args) -> None:
  """Compiles and runs one (impl, mode) once; prints its RSS growth as JSON."""
  dtype = jnp.dtype(args.dtype)
  ins = _inputs(args.B, args.T, args.V, args.D, dtype)
  jax.block_until_ready(ins)
  a = _args(args.child_mode, *ins)
  f = _function(args.child_impl, args.child_mode, args.vocab_chunk_size or None)
  compiled = f.lower(*a).compile()
  with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM to the current RSS
    fh.write("5")
  before = _status_mb("VmRSS")
  jax.block_until_ready(compiled(*a))
  print(json.dumps({"rss_mb": _status_mb("VmHWM") - before}))


def _measure_rss(args, impl, mode) -> float:
  cmd = [sys.executable, os.path.abspath(__file__), "--child-impl", impl, "--child-mode", mode,
         "--B", str(args.B), "--T", str(args.T), "--V", str(args.V), "--D", str(args.D),
         "--dtype", args.dtype, "--vocab-chunk-size", str(args.vocab_chunk_size),
         "--system-malloc"]
  out = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if out.returncode != 0:
    print(f"  [rss child {impl}/{mode} failed rc={out.returncode}: {out.stderr[-300:]}]")
    return float("nan")
  return json.loads(out.stdout.strip().splitlines()[-1])["rss_mb"]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--B", type=int, default=4)
  p.add_argument("--T", type=int, default=1024)
  p.add_argument("--V", type=int, default=151936)
  p.add_argument("--D", type=int, default=896)
  p.add_argument("--chunk-sizes", default="auto,32,128", help="'auto' = chunk_size=None")
  p.add_argument("--vocab-chunk-size", type=int, default=0, help="0 = whole vocabulary")
  p.add_argument("--modes", default="fwd,fwdbwd")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--no-rss", action="store_true")
  p.add_argument("--no-time", action="store_true")
  p.add_argument("--system-malloc", action="store_true")
  p.add_argument("--child-impl", help=argparse.SUPPRESS)
  p.add_argument("--child-mode", help=argparse.SUPPRESS)
  args = p.parse_args()
  sys.stdout.reconfigure(line_buffering=True)
  if args.child_impl:
    _child(args)
    return

  vchunk = args.vocab_chunk_size or None
  dtype = jnp.dtype(args.dtype)
  impls = ["naive"] + [("chunked auto" if c == "auto" else f"chunked c={c}")
                       for c in args.chunk_sizes.split(",")]
  ins = _inputs(args.B, args.T, args.V, args.D, dtype)
  btv = args.B * args.T * args.V * 4 / 2**20
  print(f"B={args.B} T={args.T} V={args.V} D={args.D} dtype={args.dtype} "
        f"vocab_chunk={vchunk}  [B,T,V] f32 = {btv:.0f} MB  devices={jax.devices()}  "
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} malloc_tuned={_MALLOC_TUNED}")
  for mode in args.modes.split(","):
    fns, rows = {}, {}
    for name in impls:
      f = _function(name, mode, vchunk)
      t0 = time.perf_counter()
      compiled = f.lower(*_args(mode, *ins)).compile()
      m = compiled.memory_analysis()
      peak = (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
              - m.alias_size_in_bytes) / 2**20
      rows[name] = dict(call=(m.temp_size_in_bytes + m.output_size_in_bytes) / 2**20, peak=peak,
                        args=m.argument_size_in_bytes / 2**20,
                        compile_s=time.perf_counter() - t0, rss=float("nan"), ms=float("nan"))
      fns[name] = compiled
    if not args.no_rss:
      for name in impls:
        need = rows[name]["peak"] * 1.3 + 500
        if _mem_available_mb() < need:
          print(f"  [skip RSS of {name}/{mode}: {_mem_available_mb():.0f} MB available]")
          continue
        rows[name]["rss"] = _measure_rss(args, name, mode)
    if not args.no_time:
      a = _args(mode, *ins)
      times = {name: [] for name in impls}
      for name in impls:
        jax.block_until_ready(fns[name](*a))  # warm-up
      for _ in range(args.repeats):
        for name in impls:
          t0 = time.perf_counter()
          jax.block_until_ready(fns[name](*a))
          times[name].append(time.perf_counter() - t0)
      for name in impls:
        rows[name]["ms"] = 1e3 * float(np.median(times[name]))
    base = rows["naive"]
    print(f"\nmode={mode}  (load {os.getloadavg()[0]:.1f})")
    print(f"{'impl':<16}{'args MB':>9}{'call MB':>10}{'x naive':>9}{'peak MB':>10}{'x naive':>9}"
          f"{'RSS MB':>10}{'x naive':>9}{'ms':>10}{'x naive':>9}{'compile s':>11}")
    for name in impls:
      r = rows[name]
      print(f"{name:<16}{r['args']:>9.0f}{r['call']:>10.0f}{r['call'] / base['call']:>9.3f}"
            f"{r['peak']:>10.0f}"
            f"{r['peak'] / base['peak']:>9.3f}{r['rss']:>10.0f}{r['rss'] / base['rss']:>9.3f}"
            f"{r['ms']:>10.0f}{r['ms'] / base['ms']:>9.3f}{r['compile_s']:>11.1f}")


if __name__ == "__main__":
  main()
