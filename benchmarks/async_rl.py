"""Synchronous vs asynchronous RL on the multi-turn lookup agent: trainer idle time,
trajectories per second, and held-out accuracy against wall time.

  python -m benchmarks.async_rl [--steps 30] [--seeds 0 1 2] [--out async_bench] [--m2po 4] [--quick]

Setting: `lookup` with 1-3 hop questions and two spare turns, so episode lengths spread
(1-hop episodes end after 2 turns, a policy that wanders runs to the 6-turn limit). One
supervised warm-up (exported once, `warm_start_from`) starts every run; each run trains GRPO
advantages with the decoupled PPO loss (`decoupled_ppo`; in the synchronous loop the behaviour
and proximal policies coincide, so it is PPO) for `--steps` steps of 8 prompts x 8 episodes.

* sync: `experiments.run` as is: each step samples its batch (one batched multi-turn rollout,
  which lasts as long as its longest episode), then trains. The trainer is idle while it
  samples: idle fraction = (sampling + reward time) / step time.
* async η=k: `--config.async_rollouts=True` with one rollout worker process (one prompt group
  per unit) and staleness bound η = k for each `--max_staleness` (default 1 and 4): the worker
  samples continuously; the trainer waits only when fewer than a batch of units are ready.
  Idle fraction = waiting time / training-loop time.
* async η=k m2po (`--m2po k ...`): the same with the M2PO loss against the stale behaviour policy
  (`--config.policy_loss=m2po --config.logprob_old_source=sampler`) instead of decoupled PPO.

Both share the machine's cores (here 2): on one host the asynchronous trainer and worker
compete for them, so the comparison is of the whole system's throughput. Printed: a table of
idle fraction, trajectories/s (rows trained per second of the RL loop), seconds per step and
final held-out greedy accuracy (mean over seeds, min-max); written to --out: results.csv,
table.md, curves.png (accuracy against wall time, every mode).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "experiments/configs/igpo_lookup.py")

SETTING = ["--config.estimator=grpo", "--config.policy_loss=decoupled_ppo",
           "--config.task_kwargs.min_hops=1", "--config.task_kwargs.max_hops=3",
           "--config.task_kwargs.extra_turns=2", "--config.max_turns=6",
           "--config.max_new_tokens=160", "--config.prompts_per_step=8",
           "--config.group_size=8", "--config.num_minibatches=1", "--config.mesh=data=1",
           "--config.num_eval_examples=64", "--config.checkpoint_every=0",
           "--config.samples_every=0", "--config.progress=False"]


def _run(args: list[str], log: str) -> float:
  env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
  t0 = time.perf_counter()
  with open(log, "w") as f:
    r = subprocess.run([sys.executable, "-m", "experiments.run", "--config", RECIPE, *args],
                       cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
  if r.returncode:
    raise SystemExit(f"run failed ({r.returncode}); see {log}")
  return time.perf_counter() - t0


def _metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def summarize(rows: list[dict], mode: str, batch_rows: int) -> dict:
  """Idle fraction, trajectories/s and seconds per step of one run's metrics rows."""
  steps = [r for r in rows if r["step"] > 0 and "step_time" in r]
  # The RL loop's wall time: from the step-0 row (after warm-up and the first eval) to the
  # last step, less the periodic evaluations (the same work in both modes).
  loop_s = steps[-1]["wall_time"] - rows[0]["wall_time"] - sum(r.get("eval_time", 0.0)
                                                              for r in steps)
  if mode == "sync":
    busy = sum(r["step_time"] for r in steps)
    idle = sum(r.get("time_sampling", 0.0) + r.get("time_reward", 0.0) for r in steps) / busy
  else:
    idle = sum(r["async_wait_s"] for r in steps) / loop_s
  evals = [(r["step"], r["wall_time"] - rows[0]["wall_time"], r["eval_accuracy"])
           for r in rows if "eval_accuracy" in r]
  out = {"idle_frac": idle, "traj_per_s": batch_rows * len(steps) / loop_s,
         "s_per_step": loop_s / len(steps), "final_accuracy": evals[-1][2], "evals": evals,
         "turns": float(np.mean([r.get("turns_mean", np.nan) for r in steps]))}
  if mode == "async":
    out["staleness"] = float(np.mean([r["async_staleness_mean"] for r in steps]))
    # The trainer's CPU while it waits for units (process CPU s per s waited).
    out["wait_cpu"] = (sum(r.get("async_wait_cpu_s", np.nan) for r in steps)
                       / max(sum(r["async_wait_s"] for r in steps), 1e-9))
  return out


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=30)
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  ap.add_argument("--sft_steps", type=int, default=300)
  ap.add_argument("--eval_every", type=int, default=10)
  ap.add_argument("--out", default="async_bench")
  ap.add_argument("--max_staleness", type=int, nargs="+", default=[1, 4],
                  help="async runs for each staleness bound η (async_rl.max_staleness)")
  ap.add_argument("--m2po", type=int, nargs="*", default=[], metavar="η",
                  help="also async runs with these staleness bounds and the M2PO loss against "
                       "the stale behaviour policy (policy_loss=m2po, logprob_old_source=sampler)")
  ap.add_argument("--quick", action="store_true", help="4 steps, one seed, 20 SFT steps")
  ap.add_argument("--async_flag", action="append", default=[],
                  help="a flag for the async runs (repeatable, in the = form), e.g. "
                       "--async_flag=--config.async_rl.poll_s=0.01 "
                       "--async_flag=--config.async_rl.params_file_mb=-1 (the earlier "
                       "polling and parameter transfer)")
  a = ap.parse_args(argv)
  if a.quick:
    a.steps, a.seeds, a.sft_steps, a.eval_every = 4, [0], 20, 2
  os.makedirs(a.out, exist_ok=True)
  warm = os.path.join(a.out, "warmup")
  if not os.path.exists(os.path.join(warm, "hf_policy", "config.json")):
    s = _run(SETTING + ["--workdir", warm, f"--config.sft_steps={a.sft_steps}",
                        "--config.steps=0", "--config.eval_every=0"],
             os.path.join(a.out, "warmup.log"))
    print(f"warm-up: {a.sft_steps} SFT steps, {s:.0f}s")
  common = SETTING + [f"--config.warm_start_from={os.path.join(warm, 'hf_policy')}",
                      "--config.sft_steps=0", f"--config.steps={a.steps}",
                      f"--config.eval_every={a.eval_every}", "--config.export_hf=False"]
  # label -> (workdir prefix, extra flags)
  modes = {"sync": ("sync", [])} | {
      f"async η={eta}": (f"async_eta{eta}", ["--config.async_rollouts=True",
                                             f"--config.async_rl.max_staleness={eta}",
                                             *a.async_flag])
      for eta in a.max_staleness}
  modes |= {f"async η={eta} m2po": (f"async_eta{eta}_m2po", [
      "--config.async_rollouts=True", f"--config.async_rl.max_staleness={eta}",
      "--config.policy_loss=m2po", "--config.logprob_old_source=sampler"]) for eta in a.m2po}
  results: dict[str, list[dict]] = {mode: [] for mode in modes}
  for seed in a.seeds:
    for mode, (name, extra) in modes.items():
      wd = os.path.join(a.out, f"{name}_seed{seed}")
      if not os.path.exists(os.path.join(wd, "summary.md")):
        named = {e.split("=")[0] for e in extra}  # a mode's flag replaces the setting's
        _run([x for x in common if x.split("=")[0] not in named] + extra
             + ["--workdir", wd, f"--config.seed={seed}"], wd + ".log")
      res = summarize(_metrics(wd), "sync" if mode == "sync" else "async", batch_rows=64)
      results[mode].append(res)
      print(f"{mode:11s} seed {seed}: idle {res['idle_frac']:.2f}, {res['traj_per_s']:.1f} "
            f"traj/s, {res['s_per_step']:.2f} s/step, accuracy {res['final_accuracy']:.3f}"
            + (f", trainer CPU while waiting {res['wait_cpu']:.3f} s/s" if "wait_cpu" in res
               else ""))
  _write(a.out, results)
  return results


def _write(out: str, results: dict[str, list[dict]]) -> None:
  keys = ("idle_frac", "traj_per_s", "s_per_step", "final_accuracy", "turns")
  with open(os.path.join(out, "results.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["mode", "seed_index", *keys, "staleness"])
    for mode, rs in results.items():
      for i, r in enumerate(rs):
        w.writerow([mode, i, *(f"{r[k]:.4f}" for k in keys), f"{r.get('staleness', 0):.3f}"])

  def cell(mode, k, fmt):
    v = [r[k] for r in results[mode]]
    return f"{fmt.format(np.mean(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"

  lines = ["| mode | trainer idle fraction | trajectories/s | s/step | final accuracy |",
           "|---|---|---|---|---|"]
  for mode in results:
    lines.append(f"| {mode} | {cell(mode, 'idle_frac', '{:.2f}')} | "
                 f"{cell(mode, 'traj_per_s', '{:.1f}')} | {cell(mode, 's_per_step', '{:.2f}')} | "
                 f"{cell(mode, 'final_accuracy', '{:.3f}')} |")
  lines.append("")
  for mode in results:
    if mode != "sync":
      ratio = (np.mean([r["traj_per_s"] for r in results[mode]])
               / np.mean([r["traj_per_s"] for r in results["sync"]]))
      lines.append(f"{mode} / sync trajectories/s: {ratio:.2f}x")
  text = "\n".join(lines)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(text + "\n")
  print(text)
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for mode, color in zip(results, ("tab:blue", "tab:orange", "tab:red", "tab:green")):
    for i, r in enumerate(results[mode]):
      t, acc = [e[1] for e in r["evals"]], [e[2] for e in r["evals"]]
      ax.plot(t, acc, color=color, alpha=0.8, marker="o", label=mode if i == 0 else None)
  ax.set_xlabel("wall time of the RL loop (s)")
  ax.set_ylabel("held-out greedy accuracy")
  ax.set_title("lookup agent: synchronous vs asynchronous RL")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out, "curves.png"), dpi=120)


if __name__ == "__main__":
  main()
