"""Long search-agent episodes: synchronous vs asynchronous RL on uneven episode lengths.

  python -m benchmarks.long_horizon [--steps 8] [--repeats 2] [--out long_bench] [--quick]

Setting: `search_agent_qa.py:long` (3-hop questions over the built-in corpus, a demonstrator
that makes 0-3 distractor searches per hop, 32 turns, context management at the token budget),
shrunk so that a run takes minutes on a CPU: a 2-layer model, 4 prompts x 4 episodes per step,
a 384-token context. One supervised warm-up (exported once, `warm_start_from`) starts every
run, so the policy's episodes are uneven from the first step (the demonstrations run 5 to 16
turns; a wandering policy runs to 32). Every run trains GRPO advantages with the decoupled
PPO loss for `--steps` steps and evaluates greedy held-out accuracy every `--eval_every`.

* sync: `experiments.run` as is: a step's batch is one multi-turn rollout that lasts as long
  as its longest episode, then the update; the trainer waits while it samples.
* async: `--config.async_rollouts=True`, one rollout worker (one prompt group per unit,
  staleness bound η = 1): short episodes' groups are ready early, and the trainer trains on
  whatever batch is ready while the worker keeps sampling.

Modes run interleaved (sync, async, sync, async, ...) `--repeats` times, so a change of the
machine's load hits both. Printed: per run and averaged, trajectories/s of the RL loop (rows
trained per second from the end of the first step, which compiles, to the last step,
evaluations excluded), the CPU and wall seconds of the whole run, all processes (on a shared
machine the asynchronous run's two processes may get a larger share of the cores than the
synchronous run's one; the CPU figure shows it), the
trainer's idle fraction, held-out accuracy at the last evaluation every mode had reached at
the same wall time (`acc@same wall`), and the async / sync ratio of trajectories/s measured in
the same invocation. Written to --out: results.csv and table.md.
"""
from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import time

if __package__ in (None, ""):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks import async_rl as ab  # summarize, _metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "experiments/configs/search_agent_qa.py:long")

SETTING = ["--config.estimator=grpo", "--config.policy_loss=decoupled_ppo",
           "--config.model.hidden_size=64", "--config.model.intermediate_size=128",
           "--config.model.num_layers=2", "--config.model.head_dim=16",
           "--config.max_new_tokens=384", "--config.max_observation_tokens=96",
           "--config.task_kwargs.snippet_chars=40", "--config.task_kwargs.top_k=2",
           "--config.prompts_per_step=4", "--config.group_size=4",
           "--config.num_minibatches=1", "--config.mesh=data=1",
           "--config.num_train_examples=256", "--config.num_eval_examples=16",
           "--config.checkpoint_every=0", "--config.samples_every=0",
           "--config.progress=False"]
ROWS = 4 * 4  # prompts_per_step x group_size of SETTING
MODES = {"sync": [], "async": ["--config.async_rollouts=True",
                               "--config.async_rl.max_staleness=1"]}


def _run(args: list[str], log: str) -> tuple[float, float]:
  """Runs experiments.run; (wall seconds, CPU seconds of it and its child processes)."""
  env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  with open(log, "w") as f:
    r = subprocess.run([sys.executable, "-m", "experiments.run", "--config", RECIPE, *args],
                       cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
  wall = time.perf_counter() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if r.returncode:
    raise SystemExit(f"run failed ({r.returncode}); see {log}")
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return wall, cpu


def summarize(rows: list[dict], mode: str, batch_rows: int) -> dict:
  """`benchmarks.async_rl.summarize`, with the RL loop timed from the end of its first step
  (which compiles the sampler, the continuation and the update in both modes) to its last,
  evaluations excluded."""
  out = ab.summarize(rows, mode, batch_rows)
  steps = [r for r in rows if r["step"] > 0 and "step_time" in r]
  loop_s = (steps[-1]["wall_time"] - steps[0]["wall_time"]
            - sum(r.get("eval_time", 0.0) for r in steps[1:]))
  out["traj_per_s"] = batch_rows * (len(steps) - 1) / loop_s
  out["s_per_step"] = loop_s / (len(steps) - 1)
  out["evals"] = [(s, t - (steps[0]["wall_time"] - rows[0]["wall_time"]), acc)
                  for s, t, acc in out["evals"]]
  for k in ("compactions", "answer_em"):
    out[k] = float(np.mean([r.get(k, 0.0) for r in steps]))
  return out


def _acc_at(evals: list, t: float) -> float:
  """Held-out accuracy of the last evaluation at or before wall time t of the RL loop."""
  done = [acc for _, when, acc in evals if when <= t + 1e-9]
  return done[-1] if done else float("nan")


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=8)
  ap.add_argument("--repeats", type=int, default=2, help="interleaved runs per mode")
  ap.add_argument("--sft_steps", type=int, default=150)
  ap.add_argument("--eval_every", type=int, default=4)
  ap.add_argument("--out", default="long_bench")
  ap.add_argument("--quick", action="store_true", help="3 steps, 1 repeat, 10 SFT steps")
  ap.add_argument("--flag", action="append", default=[],
                  help="a config flag for every run, warm-up included (repeatable, = form), "
                       "e.g. --flag=--config.task_kwargs.min_hops=1 for easier questions")
  a = ap.parse_args(argv)
  if a.quick:
    a.steps, a.repeats, a.sft_steps, a.eval_every = 3, 1, 10, 3
  os.makedirs(a.out, exist_ok=True)
  print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
  setting = SETTING + a.flag
  warm = os.path.join(a.out, "warmup")
  if not os.path.exists(os.path.join(warm, "hf_policy", "config.json")):
    s, _ = _run(setting + ["--workdir", warm, f"--config.sft_steps={a.sft_steps}",
                           "--config.steps=0", "--config.eval_every=0"],
                os.path.join(a.out, "warmup.log"))
    print(f"warm-up: {a.sft_steps} SFT steps, {s:.0f}s")
  common = setting + [f"--config.warm_start_from={os.path.join(warm, 'hf_policy')}",
                      "--config.sft_steps=0", f"--config.steps={a.steps}",
                      f"--config.eval_every={a.eval_every}", "--config.export_hf=False"]
  rows = ROWS
  results: dict[str, list[dict]] = {m: [] for m in MODES}
  for rep in range(a.repeats):
    for mode, extra in MODES.items():
      wd = os.path.join(a.out, f"{mode}_rep{rep}")
      load = os.getloadavg()[0]
      wall, cpu = _run(common + extra + ["--workdir", wd, f"--config.seed={rep}"],
                       wd + ".log")
      res = summarize(ab._metrics(wd), mode, batch_rows=rows)  # pylint: disable=protected-access
      res.update(load=load, wall=wall, cpu=cpu)
      results[mode].append(res)
      print(f"{mode:5s} rep {rep}: load {load:.1f}, {res['traj_per_s']:.2f} traj/s, "
            f"{res['s_per_step']:.1f} s/step, idle {res['idle_frac']:.2f}, "
            f"run CPU {res['cpu']:.0f} s (wall {wall:.0f} s), {res['turns']:.1f} "
            f"turns/episode, {res['compactions']:.2f} compactions/episode, "
            f"final accuracy {res['final_accuracy']:.3f}", flush=True)
  # accuracy at the same wall time: the last evaluation every run had reached
  t_same = min(r["evals"][-1][1] for rs in results.values() for r in rs)
  for rs in results.values():
    for r in rs:
      r["acc_same_wall"] = _acc_at(r["evals"], t_same)
  _write(a.out, results, t_same)
  return results


def _write(out: str, results: dict[str, list[dict]], t_same: float) -> None:
  keys = ("traj_per_s", "s_per_step", "idle_frac", "cpu", "wall", "turns", "compactions",
          "acc_same_wall", "final_accuracy", "load")
  with open(os.path.join(out, "results.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["mode", "repeat", *keys])
    for mode, rs in results.items():
      for i, r in enumerate(rs):
        w.writerow([mode, i, *(f"{r[k]:.4f}" for k in keys)])

  def cell(mode, k, fmt):
    v = [r[k] for r in results[mode]]
    return (f"{fmt.format(np.mean(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"
            if len(v) > 1 else fmt.format(v[0]))

  lines = [f"| mode | trajectories/s | s/step | trainer idle | run CPU s / wall s | "
           f"turns/episode | compactions/episode | accuracy @ {t_same:.0f} s | final accuracy "
           "| load |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for mode in results:
    lines.append(f"| {mode} | {cell(mode, 'traj_per_s', '{:.2f}')} | "
                 f"{cell(mode, 's_per_step', '{:.1f}')} | {cell(mode, 'idle_frac', '{:.2f}')} | "
                 f"{cell(mode, 'cpu', '{:.0f}')} / {cell(mode, 'wall', '{:.0f}')} | "
                 f"{cell(mode, 'turns', '{:.1f}')} | {cell(mode, 'compactions', '{:.2f}')} | "
                 f"{cell(mode, 'acc_same_wall', '{:.3f}')} | "
                 f"{cell(mode, 'final_accuracy', '{:.3f}')} | {cell(mode, 'load', '{:.0f}')} |")
  sync = np.mean([r["traj_per_s"] for r in results["sync"]])
  ratio = np.mean([r["traj_per_s"] for r in results["async"]]) / sync
  pairs = [a["traj_per_s"] / s["traj_per_s"] for s, a in zip(results["sync"], results["async"])]
  lines += ["", f"async / sync trajectories/s: {ratio:.2f}x (per interleaved pair: "
            + ", ".join(f"{p:.2f}" for p in pairs) + ")"]
  text = "\n".join(lines)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(text + "\n")
  print(text)


if __name__ == "__main__":
  main()
