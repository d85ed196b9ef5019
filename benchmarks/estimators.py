"""Compile time and steady-state throughput of every registered advantage estimator.

    python benchmarks/estimators.py [--batch 1024] [--seq 4096] [--group 8] [--repeats 10]
                                    [--only a,b] [--quick] [--system-malloc] [--all-cores]

Every estimator in `credit.registry` is measured. Its inputs are the contract fields it
needs (its required keyword arguments, `needs`, and the optional inputs its settings switch
on), made lazily at the run's shape by the generators of `tests/contract_fields.py` (which
cover every field of `credit.CONTRACT`: a new field or estimator is measured without touching
this file). Only the layout is set here, to look like a real batch rather than a unit test's:
response lengths uniform in [T/4, T], 0/1 rewards, contiguous groups of G (`prompt_id` one per
group, stateful estimators start from `init_state(B/G)`), and turns / steps spread evenly over
the response (K of them).

Group estimators run twice: the contiguous fast path (`group_size=G`) and the segment path
(`group_size=None`); EXTRA_CONFIGS adds non-default settings that take other code paths (fast
path only). Each is jitted once; "compile" is trace + lower + compile, "time" the best of
`--repeats` calls after one warm-up (block_until_ready). Mtok/s is B·T / time; "x base" is the
time divided by that of `reward[:, None] * mask` measured in the same run (about the cost of
writing one [B,T] array).

Both wall-clock and process CPU time (`time.process_time`) are reported. On a shared machine
(the load average is printed) wall time is inflated by other processes, while CPU time stays
close to what the work costs; the target column checks >= 1e8 tokens per CPU second (as if one
core ran it alone; XLA may use more threads, so on an idle machine wall time is at most the CPU
time). Compile above 2 s of CPU is flagged too. The process is pinned to one core before XLA
starts (`--all-cores` to keep every core): with a second core idle, XLA:CPU splits loops over two
threads and the CPU time then counts both threads' waiting too, so the same program measured
1.2-1.6x more CPU time on a quiet machine than on a loaded one; pinned, CPU time is the
single-thread work, whatever the load.

`--quick` (what tests/bench_estimators_test.py runs) takes every estimator once in each setting
(fast path only) at B=16, T=32, G=4, K=4, checks that its advantages are finite [B,T], and times
nothing that matters; it exists so that this script cannot rot.

Allocator: as in benchmarks/losses.py, glibc is told to keep freed blocks in the heap
(`_malloc.tune_malloc`), so a call reuses its [B,T] temporaries as a long-running trainer's heap
would instead of paying page faults on fresh mmaps; `--system-malloc` keeps glibc's defaults.
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import zlib
from typing import Any, Callable, Iterator, Mapping, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _malloc import tune_unless_asked_not_to  # noqa: E402

_MALLOC_TUNED = tune_unless_asked_not_to(__name__ == "__main__")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import credit.advantages  # noqa: E402,F401  (registers the estimators)
from credit import registry  # noqa: E402
from tests import contract_fields  # noqa: E402

TARGET_TOKENS_PER_S = 1e8
COMPILE_TARGET_S = 2.0
QUICK = dict(batch=16, seq=32, group=4, steps=4)


def _layout(name: str, rng: np.random.Generator, d: Mapping, f: Mapping) -> np.ndarray:
  """The fields that fix the batch's layout, at benchmark scale."""
  b, t, k = d["B"], d["T"], d["K"]
  span = max(t // k, 1)
  pos_k = np.minimum(np.arange(t) // span, k - 1)   # K equal spans of the sequence
  if name == "response_mask":
    lengths = rng.integers(max(t // 4, 1), t + 1, b)
    return np.arange(t)[None, :] < lengths[:, None]
  if name == "reward":
    return rng.choice([0.0, 1.0], b).astype(np.float32)
  if name in ("group_id", "prompt_id"):
    return (np.arange(b) // d["G"]).astype(np.int32)
  if name in ("turn_id", "step_id"):
    return np.where(f["response_mask"], pos_k, -1).astype(np.int32)
  raise KeyError(name)


_LAYOUT_FIELDS = ("response_mask", "reward", "group_id", "prompt_id", "turn_id", "step_id")


class BenchFields(Mapping):
  """Contract field name -> numpy array at (B, T), made on first use and kept.

  Each field has its own random generator (seeded by `seed` and its name), so `--only` runs
  see the same values as a full run. Layout fields come from `_layout`; every other field
  from `tests/contract_fields.py`
  (its per-field generators where values have a meaning, else a generic one by dtype),
  at the shape `credit.CONTRACT` declares with the letters in `dims`.
  """

  def __init__(self, batch: int, seq: int, group: int, steps: int = 8, seed: int = 0):
    self.dims = dict(contract_fields.DIMS, B=batch, T=seq, G=group, K=steps, S=seq + 3)
    self._seed = seed
    self._made: dict[str, np.ndarray] = {}

  def __getitem__(self, name: str) -> np.ndarray:
    if name not in self._made:
      if name not in credit.CONTRACT:
        raise KeyError(f"{name!r} is not a contract field")
      # One generator per field: its values do not depend on which fields were made before.
      rng = np.random.default_rng([self._seed, zlib.crc32(name.encode())])
      if name in _LAYOUT_FIELDS:
        value = _layout(name, rng, self.dims, self)
      elif name in contract_fields._SPECIAL:
        value = contract_fields._SPECIAL[name](rng, self.dims, self)
      else:
        value = contract_fields._generic(name, rng, self.dims)
      self._made[name] = value
    return self._made[name]

  def __iter__(self) -> Iterator[str]:
    return iter(credit.CONTRACT)

  def __len__(self) -> int:
    return len(credit.CONTRACT)


# Non-default configurations worth timing too (they take other code paths):
# name -> [(label, hyperparameters)]. The inputs a setting switches on come from the spec
# (`EstimatorSpec.needs_for`).
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


class Call(NamedTuple):
  """One row of the table: `fn(data)` runs the estimator (None with `why` when it cannot)."""
  name: str
  path: str
  fn: Callable[[dict], Any] | None
  data: dict
  spec: Any = None
  why: str = ""


def _time(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
  """Best (minimum) wall and process-CPU seconds of `fn()` over `repeats` calls, after one
  warm-up call. The minimum is the least contaminated by other processes on a shared box."""
  jax.block_until_ready(fn())
  walls, cpus = [], []
  for _ in range(max(repeats, 1)):
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


def _required(spec) -> list[str]:
  params = inspect.signature(spec.fn).parameters
  return [p for p, v in params.items()
          if v.kind == v.KEYWORD_ONLY and v.default is inspect.Parameter.empty]


def build_calls(fields: BenchFields, *, only: set[str] = frozenset(),
                quick: bool = False) -> Iterator[Call]:
  """One `Call` per (estimator, path, setting); `quick`: the fast path only."""
  batch, group = fields.dims["B"], fields.dims["G"]
  cache: dict[str, Any] = {}

  def get(name):
    if name not in cache:
      cache[name] = jax.device_put(fields[name])
    return cache[name]

  for name in registry.list_estimators():
    if only and name not in only:
      continue
    spec = registry.get_estimator(name)
    params = spec.params or tuple(inspect.signature(spec.fn).parameters)
    static = dict(REQUIRED_HYPER.get(name, {}))
    data, missing = {}, []
    for p in _required(spec):
      if p == "num_groups":
        static["num_groups"] = batch // group
      elif p == "state" and spec.stateful:   # one prompt slot per group
        data["state"] = jax.device_put(spec.init_state(batch // group))
      elif p in credit.CONTRACT:
        data[p] = None   # filled below with the setting's needs
      elif p not in static:
        missing.append(p)
    if missing:
      yield Call(name, "-", None, {}, spec, f"no value for required {missing}")
      continue
    if "num_groups" in params:
      static.setdefault("num_groups", batch // group)
    if spec.stateful and "state" not in data:
      data["state"] = jax.device_put(spec.init_state(batch // group))
    paths = [("fast", group), ("segment", None)] if "group_size" in params else [("", None)]
    configs = [("", {})] + EXTRA_CONFIGS.get(name, [])
    for label, hyper in configs:
      names = ({p for p, v in data.items() if v is None} | spec.needs_for(hyper))
      cdata = {p: v for p, v in data.items() if v is not None}
      cdata.update({f: get(f) for f in sorted(names) if f in params})
      for path, gs in (paths[:1] if (label or quick) else paths):
        kw = dict(static, **hyper)
        if "group_size" in params:
          kw["group_size"] = gs
        fn = lambda d, _f=spec.fn, _kw=kw: _f(**d, **_kw)
        yield Call(name, (path + " " + label).strip(), fn, cdata, spec)


class Row(NamedTuple):
  name: str
  path: str
  compile_wall: float
  compile_cpu: float
  wall: float
  cpu: float
  error: str = ""


def _check_output(call: Call, out: Any, shape: tuple[int, int]) -> None:
  adv = np.asarray(call.spec.advantages(out))
  if adv.shape != shape:
    raise ValueError(f"advantages have shape {adv.shape}, expected {shape}")
  if not np.isfinite(adv).all():
    raise ValueError("advantages are not all finite")


def run(*, batch: int, seq: int, group: int, repeats: int, steps: int = 8,
        only: set[str] = frozenset(), quick: bool = False,
        out: Callable[[str], None] = print) -> list[Row]:
  """Measures every call and prints the table through `out`; returns the rows."""
  tokens = batch * seq
  fields = BenchFields(batch, seq, group, steps)
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  out(f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}, "
      f"cpus={os.cpu_count()} (this process: {cores}), load average {os.getloadavg()[0]:.1f} (start), "
      f"malloc tuned: {_MALLOC_TUNED}")
  out(f"B={batch} T={seq} G={group} K={steps} tokens={tokens:,} repeats={repeats}"
      f"{' (quick)' if quick else ''}\n")

  r, m = jax.device_put(fields["reward"]), jax.device_put(fields["response_mask"])
  base_fn, base_cw, base_cc = _compile(lambda r_, m_: r_[:, None] * m_, r, m)
  base_w, base_c = _time(lambda: base_fn(r, m), repeats)

  header = (f"{'estimator':<24}{'path':<16}{'compile s':>10}{'(cpu)':>7}{'time ms':>9}"
            f"{'(cpu)':>8}{'Mtok/s':>8}{'(cpu)':>7}{'x base':>7}{'(cpu)':>6}  1e8 tok/s cpu")
  out(header)
  out("-" * len(header))

  def line(name, path, cw, cc, w, c):
    return (f"{name:<24}{path:<16}{cw:>10.2f}{cc:>7.2f}{w * 1e3:>9.1f}{c * 1e3:>8.1f}"
            f"{tokens / w / 1e6:>8.0f}{tokens / c / 1e6:>7.0f}{w / base_w:>8.1f}"
            f"{c / base_c:>8.1f}")

  out(line("baseline r[:,None]*mask", "", base_cw, base_cc, base_w, base_c))
  rows: list[Row] = []
  for call in build_calls(fields, only=only, quick=quick):
    if call.fn is None:
      rows.append(Row(call.name, call.path, 0, 0, 0, 0, call.why))
      out(f"{call.name:<24}{call.path:<16}  error: {call.why}")
      continue
    try:
      compiled, cw, cc = _compile(call.fn, call.data)
      if quick:
        t0, c0 = time.perf_counter(), time.process_time()
        _check_output(call, compiled(call.data), (batch, seq))
        w, c = time.perf_counter() - t0, time.process_time() - c0
      else:
        w, c = _time(lambda: compiled(call.data), repeats)
    except Exception as e:  # noqa: BLE001  (one broken estimator must not stop the table)
      msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      rows.append(Row(call.name, call.path, 0, 0, 0, 0, msg))
      out(f"{call.name:<24}{call.path:<16}  error: {msg}")
      continue
    rows.append(Row(call.name, call.path, cw, cc, w, max(c, 1e-9)))
    met = tokens / max(c, 1e-9) >= TARGET_TOKENS_PER_S
    flag = "met" if met else "missed"
    if cc >= COMPILE_TARGET_S:
      flag += f" (compile {cc:.1f} s cpu)"
    out(line(call.name, call.path, cw, cc, w, c) + f"  {flag}")

  timed = [x for x in rows if not x.error]
  missed = [f"{x.name}/{x.path}".rstrip("/") for x in timed
            if tokens / x.cpu < TARGET_TOKENS_PER_S]
  slow_compile = [f"{x.name}/{x.path}".rstrip("/") for x in timed
                  if x.compile_cpu >= COMPILE_TARGET_S]
  errors = [f"{x.name}/{x.path}".rstrip("/") for x in rows if x.error]
  names = {x.name for x in timed}
  out(f"\nload average {' '.join(f'{v:.1f}' for v in os.getloadavg())} (1/5/15 min, end); "
      f"target: >= {TARGET_TOKENS_PER_S / 1e6:.0f} Mtok per CPU second, compile < "
      f"{COMPILE_TARGET_S:.0f} s")
  out(f"estimators measured: {len(names)} of {len(registry.list_estimators())} registered; "
      f"rows {len(timed)}, target met {len(timed) - len(missed)}, missed {len(missed)}")
  out("missed: " + (", ".join(missed) if missed else "none"))
  out("compile >= 2 s: " + (", ".join(slow_compile) if slow_compile else "none"))
  out("errors: " + (", ".join(errors) if errors else "none"))
  return rows


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=1024)
  ap.add_argument("--seq", type=int, default=4096)
  ap.add_argument("--group", type=int, default=8, help="samples per prompt G")
  ap.add_argument("--steps", type=int, default=8, help="turns / steps per response K")
  ap.add_argument("--repeats", type=int, default=10)
  ap.add_argument("--only", default="", help="comma-separated estimator names")
  ap.add_argument("--quick", action="store_true",
                  help="every estimator once at B=16, T=32, G=4, outputs checked (CI)")
  ap.add_argument("--all-cores", action="store_true",
                  help="do not pin the process to one core (see the module docstring)")
  ap.add_argument("--system-malloc", action="store_true",
                  help="keep glibc's malloc defaults (see the module docstring)")
  args = ap.parse_args(argv)
  only = {s for s in args.only.split(",") if s}
  if not args.all_cores and hasattr(os, "sched_setaffinity"):   # before XLA's thread pool
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
  unknown = only - set(registry.list_estimators())
  if unknown:
    print(f"error: --only names unknown estimators {sorted(unknown)}", file=sys.stderr)
    return 2
  size = QUICK if args.quick else dict(batch=args.batch, seq=args.seq, group=args.group,
                                       steps=args.steps)
  rows = run(**size, repeats=1 if args.quick else args.repeats, only=only, quick=args.quick)
  return 1 if any(x.error for x in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
