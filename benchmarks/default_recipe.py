"""The default recipe (`make run`) as a distribution over seeds, on this CPU and on another
floating-point path.

Runs `experiments/configs/grpo_arithmetic.py` once per seed, one process per run, and prints a
Markdown table per floating-point variant: held-out greedy accuracy after the warm-up (step 0),
at the evaluations in between and at the end, the change, and per run its wall time, CPU time
(user + system of the run's process) and the machine's mean load average while it ran; then
the mean and the range over seeds. `--control` adds the control (`:sft_only`, the same wall
time spent on supervised warm-up only) for each seed of the first variant.

A run's result depends on the CPU's floating-point path (thousands of steps accumulate its
rounding). XLA's CPU flags change that path on one machine, a proxy for another CPU:
`--variants default,fast_math` runs every seed once as XLA compiles by default and once with
`--xla_cpu_enable_fast_math=true` (reassociation and approximate functions); `sse4` caps the
vector ISA at SSE4.2 (narrower vectors, other reduction orders).

  python benchmarks/default_recipe.py --seeds 0,1,2,3,4 --variants default,fast_math --control
  python benchmarks/default_recipe.py --seeds 0 --set steps=50 --set sft_steps=500   # explore

Runs go to `--workroot/<variant>/seed<k>` (`control/seed<k>` for the control); a finished run
(its `bench.json` written) is read back instead of rerun, so an interrupted table resumes.
`--parallel 2` runs two seeds at once (on a 2-core machine this inflates each run's wall time).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "experiments", "configs", "grpo_arithmetic.py")
VARIANTS = {
    "default": "",
    "fast_math": "--xla_cpu_enable_fast_math=true",
    "sse4": "--xla_cpu_max_isa=SSE4_2",
}


def _load_sampler(stop: threading.Event, out: list[float], every_s: float = 5.0) -> None:
  """Appends the 1-minute load average every `every_s` seconds until `stop` is set."""
  while not stop.is_set():
    out.append(os.getloadavg()[0])
    stop.wait(every_s)


def _evals(workdir: str) -> dict[int, float]:
  """{step: eval_accuracy} from a run's metrics.jsonl."""
  out = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if "eval_accuracy" in row:
        out[int(row["step"])] = float(row["eval_accuracy"])
  return out


def run_one(*, workdir: str, seed: int, xla_flags: str, control: bool,
            overrides: list[str]) -> dict:
  """One run of the recipe in a fresh process; returns its evaluations and costs."""
  done = os.path.join(workdir, "bench.json")
  if os.path.exists(done):
    with open(done) as f:
      result = json.load(f)
    result["evals"] = {int(k): v for k, v in result["evals"].items()}
    asked = {"xla_flags": xla_flags, "control": control, "overrides": overrides}
    if any(result.get(k) != v for k, v in asked.items()):
      raise SystemExit(f"error: {done} holds a run with other settings than {asked}; "
                       "use another --workroot or remove it")
    return result
  if os.path.exists(workdir):
    shutil.rmtree(workdir)  # an unfinished run: start again rather than resume
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  cmd = [sys.executable, "-m", "experiments.run",
         "--config", RECIPE + (":sft_only" if control else ""),
         "--workdir", workdir, f"--config.seed={seed}", "--config.progress=False"]
  cmd += [f"--config.{o}" for o in overrides]
  env = dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), xla_flags) if f)
  loads, stop = [], threading.Event()
  sampler = threading.Thread(target=_load_sampler, args=(stop, loads), daemon=True)
  sampler.start()
  t0 = time.perf_counter()
  with open(workdir + ".log", "w") as log:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - t0
  stop.set()
  sampler.join()
  code = os.waitstatus_to_exitcode(status)
  if code != 0:
    raise RuntimeError(f"seed {seed} exited with {code}; see {workdir}.log")
  result = {"seed": seed, "control": control, "xla_flags": xla_flags, "overrides": overrides,
            "evals": _evals(workdir), "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "load": sum(loads) / max(len(loads), 1)}
  with open(done, "w") as f:
    json.dump(result, f)
  return result


def _fmt_time(s: float) -> str:
  return f"{int(s // 60)} min {int(round(s % 60)):02d} s"


def table(rows: list[dict], controls: dict[int, dict]) -> str:
  """Markdown: one line per seed, then the mean, min and max of every column."""
  steps = sorted(set.intersection(*(set(r["evals"]) for r in rows)))
  shown = [s for s in steps if 0 < s < steps[-1]][:1] + steps[-1:]  # first eval after 0, last
  head = ["seed", "after warm-up (step 0)"] + [f"step {s}" for s in shown]
  head += ["change", "wall time", "CPU time", "load"]
  kinds = ["acc"] * (1 + len(shown)) + ["change", "time", "cpu", "load"]
  if controls:
    head.append("control: SFT only, same time")
    kinds.append("acc")
  fmt = {"acc": lambda v: f"{v:.3f}", "change": lambda v: f"{v:+.3f}", "time": _fmt_time,
         "cpu": lambda v: f"{v / 60:.1f} min", "load": lambda v: f"{v:.1f}"}
  lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
  cols = []
  for r in rows:
    e = r["evals"]
    vals = [e[0]] + [e[s] for s in shown] + [e[steps[-1]] - e[0]]
    vals += [r["wall_s"], r["cpu_s"], r["load"]]
    if controls:
      ctl = controls.get(r["seed"])
      vals.append(ctl["evals"][max(ctl["evals"])] if ctl else None)
    cols.append(vals)
    cells = [str(r["seed"])] + ["-" if v is None else fmt[k](v) for k, v in zip(kinds, vals)]
    lines.append("| " + " | ".join(cells) + " |")
  for name, agg in (("mean", lambda xs: sum(xs) / len(xs)), ("min", min), ("max", max)):
    cells = [name]
    for k, xs in zip(kinds, zip(*cols)):
      xs = [x for x in xs if x is not None]
      cell = fmt[k](agg(xs)) if xs else "-"
      cells.append(f"**{cell}**" if name == "mean" and k == "change" else cell)
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
  p.add_argument("--variants", default="default",
                 help=f"comma-separated floating-point variants: {sorted(VARIANTS)}")
  p.add_argument("--control", action="store_true",
                 help="also run the control (:sft_only) per seed, first variant only")
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="a config override for every run (e.g. steps=50); repeatable")
  p.add_argument("--parallel", type=int, default=1, help="runs at once (1 or 2)")
  p.add_argument("--workroot", default=os.path.join(ROOT, "runs", "default_recipe"))
  a = p.parse_args(argv)
  seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
  variants = [v.strip() for v in a.variants.split(",") if v.strip()]
  for v in variants:
    if v not in VARIANTS:
      p.error(f"--variants {v!r} is not a variant; choose from {sorted(VARIANTS)}")
  if a.parallel not in (1, 2):
    p.error(f"--parallel {a.parallel} must be 1 or 2; more only slows every run down")
  jobs = [(v, s, False) for v in variants for s in seeds]
  jobs += [(variants[0], s, True) for s in seeds] if a.control else []
  results: dict[tuple, dict] = {}
  errors: list[str] = []

  def work(job):
    v, s, ctl = job
    wd = os.path.join(a.workroot, "control" if ctl else v, f"seed{s}")
    try:
      r = run_one(workdir=wd, seed=s, xla_flags=VARIANTS[v], control=ctl, overrides=a.set)
    except (RuntimeError, SystemExit) as e:
      errors.append(str(e))
      print(e, flush=True)
      return
    results[job] = r
    first, last = r["evals"][0], r["evals"][max(r["evals"])]
    print(f"{'control' if ctl else v} seed {s}: {first:.3f} -> {last:.3f} "
          f"({last - first:+.3f}), wall {_fmt_time(r['wall_s'])}, CPU {r['cpu_s'] / 60:.1f} min, "
          f"load {r['load']:.1f}", flush=True)

  pending = list(jobs)
  while pending:
    batch, pending = pending[:a.parallel], pending[a.parallel:]
    threads = [threading.Thread(target=work, args=(j,)) for j in batch]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  extra = f" (overrides: {', '.join(a.set)})" if a.set else ""
  for v in variants:
    rows = [results[(v, s, False)] for s in seeds if (v, s, False) in results]
    ctl = {s: results[(v, s, True)] for s in seeds if (v, s, True) in results}
    if not rows:
      continue
    print(f"\n{v} (XLA_FLAGS={VARIANTS[v] or '<none>'}){extra}\n")
    print(table(rows, ctl))
  runs = [r for (v, s, ctl), r in results.items() if not ctl]
  changes = [r["evals"][max(r["evals"])] - r["evals"][0] for r in runs]
  if changes:
    print(f"\nall {len(changes)} RL runs: change mean {sum(changes) / len(changes):+.3f}, "
          f"range {min(changes):+.3f} to {max(changes):+.3f}; "
          f"{sum(c < 0.30 for c in changes)} below +0.30")
  if errors:
    sys.exit(f"{len(errors)} run(s) failed")


if __name__ == "__main__":
  main()
