"""The asynchronous runner's plumbing (experiments/async_rl.py): parameter transfer to a
rollout worker through the coordination store vs through a file, and the CPU a process
spends waiting, polling vs blocking.

  python -m benchmarks.async_transfer [--sizes_mb 12 200] [--repeats 3] [--wait_s 5]

Two processes on this machine over the coordination service, as in a run: process 0 (the
trainer) and process 1 (a rollout worker).

* transfer: the trainer publishes version v of a float32 parameter tree of each size with the
  runner's own `_Feed.publish` (`async_rl.params_file_mb` picks the path: -1 the store, 0 a
  safetensors file that the store names), the worker fetches it with the runner's
  `_Held.newest` onto its device. Printed per size and path: the trainer's publish time, the
  worker's fetch time (from the state naming v to the parameters on its device) and the
  end-to-end latency (trainer starts publishing -> worker holds the parameters), medians over
  `--repeats` versions.
* waiting: one process waits `--wait_s` seconds for a key the other sets then (as the trainer
  waits for a rollout unit and a gated worker for a new version), with `Coordinator.wait_key`:
  polling every 10 ms (`async_rl.poll_s=0.01`, the earlier runner) vs one blocking get
  (`poll_s=0`, now). Printed: the waiter's CPU seconds (`time.process_time`, all its
  threads) and how late it woke.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import types

if __package__ in (None, ""):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tree(mb: float, seed: int):
  """A float32 parameter tree of `mb` MiB: 1 MiB-to-4 MiB matrices, like a model's layers."""
  import jax
  import numpy as np
  rng = np.random.default_rng(seed)
  n, leaves, i = int(mb * 2**20) // 4, {}, 0
  while n > 0:
    size = min(n, 2**18 * (1 + i % 4))  # floats
    x = rng.standard_normal(size, np.float32)
    leaves[f"w{i:04d}"] = jax.device_put(x.reshape(-1, 256) if size % 256 == 0 else x)
    n, i = n - size, i + 1
  return leaves


def _process(pid: int, address: str, cfg: dict, out_q) -> None:
  import jax
  import numpy as np
  from experiments import async_rl
  from experiments.coordination import Coordinator
  coord = Coordinator(address, 2, pid, heartbeat_s=60)
  results = []
  version = 0
  for mb in cfg["sizes_mb"]:
    like = _tree(mb, seed=0)
    for path_name, file_mb in (("store", -1.0), ("file", 0.0)):
      a = types.SimpleNamespace(params_file_mb=file_mb, timeout_s=600.0)
      feed = async_rl._Feed(coord, a, 1, 0, params_dir=cfg["dir"])  # pylint: disable=protected-access
      held = async_rl._Held(coord, a, like)  # pylint: disable=protected-access
      rows = []
      for r in range(cfg["repeats"]):
        version += 1
        coord.barrier(f"bench/t/{version}", 600)
        if pid == 0:
          params = jax.tree.map(lambda x: x + r, like)
          jax.block_until_ready(params)
          t0 = time.time()
          try:
            feed.publish(params, version)
            err = ""
          except Exception as e:  # pylint: disable=broad-except
            err = str(e).splitlines()[0][:120]
            coord.set_json(async_rl._STATE, {"version": -1, "error": err})  # pylint: disable=protected-access
          publish_s = time.time() - t0
          done = coord.get_json(f"bench/done/{version}", 600)
          rows.append({"publish_s": publish_s, "fetch_s": done["fetch_s"],
                       "latency_s": done["t_end"] - t0, "error": err or done.get("error", "")})
        else:
          state = coord.get_json(async_rl._STATE, 600)  # pylint: disable=protected-access
          while state["version"] not in (version, -1):
            time.sleep(0.001)
            state = coord.get_json(async_rl._STATE, 600)  # pylint: disable=protected-access
          t1 = time.time()
          err = state.get("error", "")
          if not err:
            held.newest(state)
            jax.block_until_ready(held.params)
            ok = np.allclose(np.asarray(jax.tree.leaves(held.params)[0]),
                             np.asarray(jax.tree.leaves(like)[0]) + r)
            err = "" if ok else "wrong values"
          t_end = time.time()
          coord.set_json(f"bench/done/{version}", {"fetch_s": t_end - t1, "t_end": t_end,
                                                   "error": err})
      if pid == 0:
        feed.remove_files()
        med = lambda k: statistics.median(x[k] for x in rows)
        results.append({"kind": "transfer", "size_mb": mb, "path": path_name,
                        "publish_s": med("publish_s"), "fetch_s": med("fetch_s"),
                        "latency_s": med("latency_s"),
                        "error": next((x["error"] for x in rows if x["error"]), "")})
  for mode, poll_s in (("poll 10 ms", 0.01), ("block", 0.0)):
    for waiter in (0, 1):
      key = f"bench/wait/{mode}/{waiter}"
      coord.barrier(key, 600)
      if pid == waiter:
        t0, c0 = time.time(), time.process_time()
        set_at = float(coord.wait_key(key, 600, poll_s))
        cpu, late = time.process_time() - c0, time.time() - set_at
        coord.set_json(key + "/result", {"cpu_s": cpu, "wall_s": time.time() - t0,
                                         "late_ms": late * 1e3})
      else:
        time.sleep(cfg["wait_s"])
        coord.set(key, str(time.time()))
      if pid == 0:
        res = coord.get_json(key + "/result", 600)
        results.append({"kind": "wait", "mode": mode,
                        "waiter": "trainer" if waiter == 0 else "worker", **res})
  coord.barrier("bench/end", 600)
  if pid == 0:
    out_q.put(results)
  coord.close()


def main(argv=None) -> list[dict]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sizes_mb", type=float, nargs="+", default=[12.0, 200.0])
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--wait_s", type=float, default=5.0)
  ap.add_argument("--dir", default="", help="parameter files' directory (default: a temp dir)")
  a = ap.parse_args(argv)
  from experiments.coordination import free_port
  cfg = {"sizes_mb": a.sizes_mb, "repeats": a.repeats, "wait_s": a.wait_s,
         "dir": a.dir or tempfile.mkdtemp(prefix="async_transfer_")}
  address = f"localhost:{free_port()}"
  ctx = mp.get_context("spawn")
  q = ctx.Queue()
  procs = [ctx.Process(target=_process, args=(i, address, cfg, q)) for i in (0, 1)]
  for p in procs:
    p.start()
  results = q.get()
  for p in procs:
    p.join(timeout=120)
  print("| parameters | path | trainer publish s | worker fetch s | end-to-end s |")
  print("|---|---|---|---|---|")
  for r in results:
    if r["kind"] == "transfer":
      cells = (f"{r['publish_s']:.3f} | {r['fetch_s']:.3f} | {r['latency_s']:.3f}"
               if not r["error"] else f"failed: {r['error']} | | ")
      print(f"| {r['size_mb']:g} MiB | {r['path']} | {cells} |")
  print()
  print(f"| waiting {a.wait_s:.0f} s for a key | waiter | CPU s while waiting | woke late ms |")
  print("|---|---|---|---|")
  for r in results:
    if r["kind"] == "wait":
      print(f"| {r['mode']} | {r['waiter']} | {r['cpu_s']:.3f} | {r['late_ms']:.1f} |")
  print(json.dumps(results))
  return results


if __name__ == "__main__":
  main()
