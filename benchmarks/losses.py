"""Compile time and throughput of every registered policy loss (plus KL / value / entropy).

    python benchmarks/losses.py [--batch 1024] [--seq 4096] [--repeats 15] [--only a,b]
                                [--system-malloc]

For each loss: the time to lower+compile the jitted function, and tokens/s (B·T per call)
of the forward pass (loss and all metrics) and of forward+grad w.r.t. `logprob` (loss,
metrics and gradient), taking the fastest of `--repeats` calls after one warm-up (the
machine is shared; the minimum is the least noisy estimate). Inputs come from a per-field
factory (`FIELDS`), so a new registry entry is benchmarked as soon as it is registered.
The "x base" columns divide the loss's time by the time of a baseline measured in the
same run: the bandwidth floor sum(where(M, −A·log π, 0)) / ΣM, which reads the same
bytes as GPG's loss.

Allocator: XLA:CPU materialises the input of every reduction as a [B,T] temporary; glibc
serves blocks above its mmap threshold (≤ 32 MiB) with fresh mmaps, so every call pays
page faults on ~100 MB of temporaries, which dominated the timings. By default this script
calls mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD=huge) at start so temporaries are reused (as a
long-running trainer's heap would be); `--system-malloc` keeps glibc's defaults.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _malloc import tune_unless_asked_not_to  # noqa: E402

_MALLOC_TUNED = tune_unless_asked_not_to(__name__ == "__main__")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from credit import losses  # noqa: E402
from credit.registry import get_policy_loss, list_policy_losses  # noqa: E402


def _normal(key, shape, scale=1.0, shift=0.0):
  return shift + scale * jax.random.normal(key, shape, jnp.float32)


# Field name -> factory(key, (B, T), fields built so far) for that contract field.
FIELDS = {
    "logprob_old": lambda k, s, d: -jnp.abs(_normal(k, s, 1.0)),
    "logprob": lambda k, s, d: d["logprob_old"] + _normal(k, s, 0.1),
    "logprob_ref": lambda k, s, d: d["logprob_old"] + _normal(k, s, 0.1),
    "logprob_sampler": lambda k, s, d: d["logprob_old"] + _normal(k, s, 0.05),
    "advantages": lambda k, s, d: jnp.repeat(_normal(k, (s[0], 1)), s[1], axis=1),
    "response_mask": lambda k, s, d: (jnp.arange(s[1])[None, :]
                                      < jax.random.randint(k, (s[0], 1), 1, s[1] + 1)),
    "entropy": lambda k, s, d: jnp.abs(_normal(k, s)),
    "values": lambda k, s, d: _normal(k, s),
    "values_old": lambda k, s, d: _normal(k, s),
    "returns": lambda k, s, d: _normal(k, s),
}


def make_inputs(B: int, T: int, seed: int = 0) -> dict[str, jax.Array]:
  data: dict[str, jax.Array] = {}
  key = jax.random.key(seed)
  for i, name in enumerate(FIELDS):  # dict order: dependencies come first
    data[name] = FIELDS[name](jax.random.fold_in(key, i), (B, T), data)
  return jax.block_until_ready(data)


def _time(fn, args, repeats):
  """(fastest wall time, mean process CPU time) over `repeats` calls after a warm-up."""
  jax.block_until_ready(fn(*args))
  ts = []
  c0 = time.process_time()
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return min(ts), (time.process_time() - c0) / repeats


def _entries(data):
  """(name, differentiable field, fn(x, fields) -> LossOutput, fields)."""
  out = []
  for name in list_policy_losses():
    spec = get_policy_loss(name)
    fields = {k: data[k] for k in sorted(spec.needs) if k != "logprob"}
    out.append((name, "logprob", lambda x, f, fn=spec.fn: fn(logprob=x, **f), fields))
  pol = {k: data[k] for k in ("logprob_old", "advantages", "response_mask")}
  ppo = get_policy_loss("ppo_clip").fn
  out.append(("ppo_clip+tis", "logprob", lambda x, f: ppo(logprob=x, **f),
              {**pol, "logprob_sampler": data["logprob_sampler"]}))
  out.append(("kl_loss(k3)", "logprob", lambda x, f: losses.kl_loss(logprob=x, **f),
              {"logprob_ref": data["logprob_ref"], "response_mask": data["response_mask"]}))
  out.append(("value_loss", "values", lambda x, f: losses.value_loss(values=x, **f),
              {k: data[k] for k in ("values_old", "returns", "response_mask")}))
  out.append(("entropy_bonus", "entropy",
              lambda x, f: losses.entropy_bonus(entropy=x, coef=1e-3, **f),
              {"response_mask": data["response_mask"]}))
  return out


def _baseline(lp, f):
  m = f["response_mask"]
  return jnp.sum(jnp.where(m, -f["advantages"] * lp, 0.0)) / jnp.maximum(
      jnp.sum(m, dtype=jnp.float32), 1.0)


def run(B: int, T: int, repeats: int, only: set[str] = frozenset()) -> list[tuple]:
  """Rows (name, compile fwd s, compile grad s, fwd tok/s, fwd ratio, grad tok/s, ratio,
  mean CPU seconds of one fwd+grad call)."""
  data = make_inputs(B, T)
  ntok = B * T
  base_f = {"advantages": data["advantages"], "response_mask": data["response_mask"]}
  base_fwd, _ = _time(jax.jit(_baseline), (data["logprob"], base_f), repeats)
  base_grad, cpu = _time(jax.jit(jax.value_and_grad(_baseline)), (data["logprob"], base_f),
                         repeats)
  rows = [("baseline", 0.0, 0.0, ntok / base_fwd, 1.0, ntok / base_grad, 1.0, cpu)]
  for name, arg, fn, fields in _entries(data):
    if only and name not in only:
      continue
    x0 = data[arg]
    fwd = jax.jit(lambda x, f, fn=fn: tuple(fn(x, f)))
    grad = jax.jit(jax.value_and_grad(lambda x, f, fn=fn: tuple(fn(x, f)), has_aux=True))
    t0 = time.perf_counter()
    fwd_c = fwd.lower(x0, fields).compile()
    c_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    grad_c = grad.lower(x0, fields).compile()
    c_grad = time.perf_counter() - t0
    t_fwd, _ = _time(fwd_c, (x0, fields), repeats)
    t_grad, cpu = _time(grad_c, (x0, fields), repeats)
    (val, _), g = grad_c(x0, fields)
    if not (np.isfinite(float(val)) and bool(jnp.all(jnp.isfinite(g)))):
      raise FloatingPointError(f"{name}: non-finite loss or gradient")
    rows.append((name, c_fwd, c_grad, ntok / t_fwd, t_fwd / base_fwd, ntok / t_grad,
                 t_grad / base_grad, cpu))
  return rows


def format_table(rows) -> str:
  hdr = (f"{'loss':<16}{'compile fwd s':>14}{'compile grad s':>15}{'fwd Mtok/s':>12}"
         f"{'x base':>8}{'fwd+grad Mtok/s':>17}{'x base':>8}{'grad cpu ms':>13}")
  lines = [hdr, "-" * len(hdr)]
  for name, cf, cg, tf, rf, tg, rg, cpu in rows:
    lines.append(f"{name:<16}{cf:>14.3f}{cg:>15.3f}{tf / 1e6:>12.1f}{rf:>8.2f}"
                 f"{tg / 1e6:>17.1f}{rg:>8.2f}{cpu * 1e3:>13.1f}")
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=1024)
  ap.add_argument("--seq", type=int, default=4096)
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("--only", type=str, default="")
  ap.add_argument("--system-malloc", action="store_true")
  args = ap.parse_args(argv)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; B={args.batch} "
        f"T={args.seq} ({args.batch * args.seq / 1e6:.2f}M tokens); fastest of "
        f"{args.repeats}; malloc tuned: {_MALLOC_TUNED}")
  rows = run(args.batch, args.seq, args.repeats, set(filter(None, args.only.split(","))))
  print(format_table(rows))


if __name__ == "__main__":
  main()
