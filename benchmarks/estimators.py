"""Compile time and steady-state throughput of every registered advantage estimator.

    python benchmarks/estimators.py --batch 1024 --seq 4096 --group 8 --repeats 10

For each estimator in `credit.registry` the inputs are built from a per-field
factory keyed by the function's required keyword arguments (so a newly
registered estimator is benchmarked without touching this file, as long as its
inputs are contract fields listed in field_factories; stateful estimators start from
their registry entry's `init_state(num_prompts)`).
Group estimators run twice: the contiguous fast path (`group_size=G`) and the
segment path (`group_size=None`); EXTRA_CONFIGS adds non-default settings that
take other code paths (fast path only). Each is jitted once; "compile" is
trace + lower + compile, "time" the best of `--repeats` calls after one warm-up
(block_until_ready). Throughput is B·T / time; "x base" is time divided by the
time of a baseline elementwise op `reward[:, None] * mask` measured in the same
run (about the cost of writing one [B,T] array).

Both wall-clock and process CPU time are reported. On a shared machine (the
load average is printed) wall time is inflated by other processes, while CPU
time stays close to what the work costs; "ok" checks the targets (>= 1e8
tokens/s, compile < 2 s) on CPU time, i.e. as if one core ran it alone (XLA
may use more threads, so on an idle machine wall time is at most the CPU time).
"""
from __future__ import annotations

import argparse
import inspect
import os
import time
from typing import Any, Callable

import jax
import numpy as np

import credit.advantages  # noqa: F401  (registers the estimators)
from credit import registry


def field_factories(batch: int, seq: int, group: int,
                    seed: int = 0) -> dict[str, Callable[[], Any]]:
  """Name -> zero-argument maker of a realistic array for that field."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(seq // 4, seq + 1, batch)
  mask = np.arange(seq)[None, :] < lengths[:, None]
  f32 = np.float32
  bt = (batch, seq)
  return {
      "reward": lambda: rng.choice([0.0, 1.0], batch).astype(f32),
      "group_id": lambda: (np.arange(batch) // group).astype(np.int32),
      "response_mask": lambda: mask,
      "obs_mask": lambda: np.zeros(bt, bool),
      "turn_id": lambda: np.where(mask, 0, -1).astype(np.int32),
      "logprob": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "logprob_old": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "logprob_ref": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "logprob_teacher": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "logprob_sampler": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "entropy": lambda: rng.uniform(0, 3, bt).astype(f32),
      "values": lambda: rng.uniform(-1, 1, bt).astype(f32),
      "values_old": lambda: rng.uniform(-1, 1, bt).astype(f32),
      "values_ref": lambda: rng.uniform(-1, 1, bt).astype(f32),
      "logprob_prm": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "logprob_alt_pos": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "logprob_alt_neg": lambda: rng.uniform(-5, 0, bt).astype(f32),
      "logprob_interventions": lambda: rng.uniform(-5, 0, bt + (2,)).astype(f32),
      "flag_mask": lambda: mask & (rng.uniform(size=bt) < 0.1),
      "logprob_followup": lambda: rng.uniform(-5, 0, (batch, 2)).astype(f32),
      "logprob_answer": lambda: rng.uniform(-5, 0, (batch, 8)).astype(f32),
      "logprob_answer_prior": lambda: rng.uniform(-5, 0, (batch, 8)).astype(f32),
      "answer_mask": lambda: np.arange(8)[None, :] < rng.integers(1, 9, (batch, 1)),
      "token_reward": lambda: (0.01 * rng.standard_normal(bt)).astype(f32),
      "step_reward": lambda: rng.uniform(0, 1, (batch, 8)).astype(f32),
      "step_mask": lambda: np.ones((batch, 8), bool),
      "reward_baseline": lambda: rng.uniform(0, 1, batch).astype(f32),
      "reward_components": lambda: rng.choice([0.0, 1.0], (batch, 3)).astype(f32),
      "sum_pi_squared": lambda: rng.uniform(0.05, 1, bt).astype(f32),
      "is_weights": lambda: rng.uniform(0.5, 1.5, bt).astype(f32),
      "prompt_id": lambda: (np.arange(batch) // group).astype(np.int32),
  }


# Non-default configurations worth timing too (they take other code paths):
# name -> [(label, hyperparameters, extra optional data fields)].
# Extra inputs switched on by a setting come from the spec (`EstimatorSpec.needs_for`).
EXTRA_CONFIGS: dict[str, list[tuple[str, dict]]] = {
    "gae": [("lam=.95", dict(gamma=0.99, lam=0.95)), ("kl,γ=λ=1", dict(kl_coef=0.001))],
    "reinforce_pp": [("γ=.99", dict(gamma=0.99)), ("kl,γ=.99", dict(gamma=0.99, kl_coef=0.001)),
                     ("kl,γ=1", dict(kl_coef=0.001))],
    "optimal_token_baseline": [("tir", dict(align="valid_index"))],
    "grpo_passk": [("analytic", dict(method="analytic", k=4))],
}


# Hyperparameters without a default (the runner fills them from the model; see docstrings).
REQUIRED_HYPER: dict[str, dict] = {
    "dgpo": {"vocab_size": 151_936},  # Qwen-sized |V| for the entropy gate H/log|V|
}


def _time(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
  """Best (minimum) wall and process-CPU seconds of `fn()` over `repeats` calls, after one
  warm-up call. The minimum is the least contaminated by other processes on a shared box."""
  jax.block_until_ready(fn())
  walls, cpus = [], []
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  return min(walls), min(cpus)


def _compile(fn: Callable, *args) -> tuple[Any, float, float]:
  """(compiled, wall s, CPU s) of trace + lower + compile."""
  t0, c0 = time.perf_counter(), time.process_time()
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, time.perf_counter() - t0, time.process_time() - c0


def build_calls(batch: int, seq: int, group: int):
  """Yields (name, path, fn(data), data) or (name, path, None, reason) per estimator."""
  fields = field_factories(batch, seq, group)
  cache: dict[str, Any] = {}

  def get(name):
    if name not in cache:
      cache[name] = jax.device_put(fields[name]())
    return cache[name]

  for name in registry.list_estimators():
    spec = registry.get_estimator(name)
    params = inspect.signature(spec.fn).parameters
    required = [p for p, v in params.items()
                if v.kind == v.KEYWORD_ONLY and v.default is inspect.Parameter.empty]
    data, static, missing = {}, {}, []
    for p in sorted(set(required) | set(spec.needs)):
      if p == "num_groups":
        static["num_groups"] = batch // group
      elif p == "state":
        if spec.stateful:   # one prompt slot per group
          data["state"] = jax.device_put(spec.init_state(batch // group))
        else:
          missing.append("state")
      elif p in fields:
        data[p] = get(p)
      else:
        missing.append(p)
    if missing:
      yield name, "-", None, f"no input factory for {missing}"
      continue
    static.update(REQUIRED_HYPER.get(name, {}))
    paths = [("fast", group), ("segment", None)] if "group_size" in params else [("", None)]
    configs = [("", {})] + EXTRA_CONFIGS.get(name, [])
    for label, hyper in configs:
      cdata = dict(data, **{f: get(f) for f in spec.needs_for(hyper) - spec.needs})
      for path, gs in paths[:1] if label else paths:
        kw = dict(static, **hyper)
        if "group_size" in params:
          kw["group_size"] = gs
        fn = lambda d, _f=spec.fn, _kw=kw: _f(**d, **_kw)
        yield name, (path + " " + label).strip(), fn, cdata


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=1024)
  ap.add_argument("--seq", type=int, default=4096)
  ap.add_argument("--group", type=int, default=8, help="samples per prompt G")
  ap.add_argument("--repeats", type=int, default=10)
  ap.add_argument("--only", default="", help="comma-separated estimator names")
  args = ap.parse_args(argv)
  batch, seq = args.batch, args.seq
  tokens = batch * seq
  only = {s for s in args.only.split(",") if s}

  print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}, "
        f"cpus={os.cpu_count()}, load average {os.getloadavg()[0]:.1f} (start)")
  print(f"B={batch} T={seq} G={args.group} tokens={tokens:,} repeats={args.repeats}\n")

  fields = field_factories(batch, seq, args.group)
  r = jax.device_put(fields["reward"]())
  m = jax.device_put(fields["response_mask"]())
  base_fn, base_cw, base_cc = _compile(lambda r_, m_: r_[:, None] * m_, r, m)
  base_w, base_c = _time(lambda: base_fn(r, m), args.repeats)

  header = (f"{'estimator':<24}{'path':<16}{'compile s':>10}{'(cpu)':>7}{'time ms':>9}{'(cpu)':>8}"
            f"{'Mtok/s':>8}{'(cpu)':>7}{'x base':>7}{'(cpu)':>6}  ok")
  print(header)
  print("-" * len(header))

  def row(name, path, cw, cc, w, c):
    return (f"{name:<24}{path:<16}{cw:>10.2f}{cc:>7.2f}{w * 1e3:>9.1f}{c * 1e3:>8.1f}"
            f"{tokens / w / 1e6:>8.0f}{tokens / c / 1e6:>7.0f}{w / base_w:>8.1f}{c / base_c:>8.1f}")

  print(row("baseline r[:,None]*mask", "", base_cw, base_cc, base_w, base_c))
  misses = []
  for name, path, fn, data in build_calls(batch, seq, args.group):
    if only and name not in only:
      continue
    if fn is None:
      print(f"{name:<24}{path:<16}  skipped: {data}")
      continue
    compiled, cw, cc = _compile(fn, data)
    w, c = _time(lambda: compiled(data), args.repeats)
    ok = tokens / c >= 1e8 and cc < 2.0
    if not ok:
      misses.append(f"{name}/{path}")
    print(row(name, path, cw, cc, w, c) + f"  {'yes' if ok else 'NO'}")
  print(f"\nload average {os.getloadavg()[0]:.1f} (end); targets (CPU time): >= 100 Mtok/s, "
        "compile < 2 s")
  print("misses: " + (", ".join(misses) if misses else "none"))


if __name__ == "__main__":
  main()
