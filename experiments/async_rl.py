"""Asynchronous RL: rollout workers that never wait for the trainer (ASearcher / AReaL).

`--config.async_rollouts=True` splits a run into processes: process 0 trains, processes
1..W sample (`c.async_rl.num_workers`). They are coordinated by JAX's coordination service
(`experiments/coordination.py`): a key-value store with heartbeats, no RPC layer of our own.
On one machine `python -m experiments.run ... --config.async_rollouts=True` starts the
workers itself (they share the CPU cores); on a cluster start every process yourself with
`--coordinator=HOST:PORT --num_processes=W+1 --process_id=i` (the trainer is process 0).

Units. A rollout unit is `c.async_rl.groups_per_rollout` = u prompts with their G samples
each (whole groups, so group statistics never see a partial group). Unit s takes global
prompts s·u .. s·u+u−1 of a deterministic per-epoch shuffle of the train split and the
sampling key fold_in(seed, s): what a unit holds depends only on s and the parameters the
worker had. A step consumes B = prompts_per_step / u units.

Staleness (AReaL's rollout controller, `areal/core/staleness_manager` in the released code;
ASearcher runs it with `max_head_offpolicyness` η = 4; our default is 1, see the README's
sync-vs-async table). A worker may start a unit only while

    capacity = min(max_in_flight − (ready + running),  (η + v + 1)·B − (accepted + running)) > 0

with v the trainer's current version (RL steps done). Rows are not filtered by age in the
released code; this rule caps how far generation runs ahead. A long episode can still be
consumed more than η versions after its parameters (others overtake it): with
`c.async_rl.drop_stale` such units are dropped at consumption and counted as not accepted.
Each unit is stamped with the version of the parameters that generated it, and each of its
rows carries it as the contract field `policy_version`; the metrics report the staleness
(version at training − `policy_version`) of every step. `loss_kwargs.max_staleness` = η'
applies the bound per row inside the loss instead (`credit.losses.reduce_policy_loss`: rows
more than η' versions old leave the loss's mask; metric `stale_row_frac`), with any loss.

Interruptible rollouts (`c.async_rl.interrupt`, on by default, multi-turn tasks). A long
episode need not finish on the parameters it started with: between turns the worker takes
the newest published parameters, and the rest of the unit is sampled with them (AReaL
interrupts generation on a weight update and continues; here at turn granularity, and the
cache of the earlier turns is not recomputed). Every token's `logprob_sampler` is the
distribution it was drawn from, so the decoupled loss's behaviour weight stays exact; the
unit is stamped with its oldest version (`version`) and its newest (`version_last`).
A single-turn unit is one sampler call and keeps its parameters.

Workers run the rollout and the reward stages of the method's producer plan (the sampler's
log-probs of the behaviour policy, `logprob_sampler`, come with the unit); the trainer runs
the rest on the assembled batch with the current parameters, so `logprob_old` is the
proximal policy recomputed at train time (the decoupled PPO loss `decoupled_ppo` takes both),
then the estimator and the update, and publishes the new parameters (version v+1).

Waiting. Nothing polls: the service's one blocking call is a get of a key not yet set, so
every event is a new key (a ready unit is announced under async/ready/<n>, n from an atomic
counter; the trainer's n-th state under async/stateseq/<n>) and a waiter blocks on the next
number — the trainer for units, a worker the staleness gate holds for the next state.
(`async_rl.poll_s` > 0 polls instead, the earlier way; benchmarks/async_transfer.py measures
both: 0.04-0.07 CPU s per s waited polling every 10 ms, ~0.001 blocking.)

Parameters. The trainer publishes each version once. Trees of at least
`async_rl.params_file_mb` MiB (default 1) are written to a safetensors file in
`async_rl.params_dir` (default <workdir>/async/params; on a cluster a directory every host
mounts), renamed into place, and the store carries only its path; smaller trees go through
the store. Files two versions old are deleted (a worker that opened one still reads it).
benchmarks/async_transfer.py (one machine, two runs): 200 MiB takes 4.9-6.3 s end to end
through the store and 0.3-0.4 s through a file; 12 MiB 0.15-0.22 s vs 0.015-0.05 s; 1 MiB
0.014 s vs 0.007 s; at 0.05 MiB (the tests' tiny model) they are equal.

Resume. The trainer's checkpoint holds its state and the ledger: which units were consumed
and how many were dropped. Units that were sampled or ready but not consumed at the
checkpoint are regenerated after a restart (the regeneration rule: every unit index not
consumed is sampled again, with the parameters of the restored version). A killed process
stops the others through the service's heartbeats; rerunning the command resumes.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import credit
from credit import parallel
from credit import tasks as tasks_lib
from experiments import loop, producers
from experiments.coordination import Coordinator, CoordinationError, free_port

SetupError = producers.SetupError

# Producer phases a worker runs (the rollout root and the host-side reward producers); the
# trainer runs every other planned stage on the assembled batch.
WORKER_PHASES = ("sampling", "reward")
_ROLLOUT_SALT = 0x5A11


# --------------------------------------------------------------------------
# Settings.
# --------------------------------------------------------------------------


def check_async(c: ml_collections.ConfigDict) -> None:
  """SetupError for an asynchronous setting the runner cannot run (before anything starts)."""
  a = c.async_rl
  if a.num_workers < 1:
    raise SetupError(f"async_rl.num_workers={a.num_workers} must be >= 1")
  if a.max_staleness < 0:
    raise SetupError(f"async_rl.max_staleness={a.max_staleness} must be >= 0 (0: a unit may "
                     "start only with the newest parameters' batch budget)")
  u = a.groups_per_rollout
  if u < 1 or c.prompts_per_step % u:
    raise SetupError(f"async_rl.groups_per_rollout={u} must be >= 1 and divide "
                     f"prompts_per_step={c.prompts_per_step}")
  B = c.prompts_per_step // u
  if a.max_in_flight and a.max_in_flight < B:
    raise SetupError(f"async_rl.max_in_flight={a.max_in_flight} rollout units is smaller than "
                     f"one batch ({B} units of {u} prompts): the trainer could never fill a step")
  if (c.logprob_old_source != "recompute" and c.policy_loss in credit.list_policy_losses()
      and "logprob_sampler" in credit.get_policy_loss(c.policy_loss).needs):
    raise SetupError(f"async_rollouts with {c.policy_loss}: logprob_old_source must be "
                     "'recompute' (the loss weighs the recomputed proximal policy against the "
                     "behaviour policy's logprob_sampler, which would then be the same). "
                     "logprob_old_source='sampler' trains against the stale behaviour policy "
                     "itself, as M2PO (policy_loss=m2po) does")
  if c.tree.branches > 0 or c.slate.candidates > 0 or c.amft.enabled:
    raise SetupError("async_rollouts: tree rollouts, SLATE step sampling and AMFT are not "
                     "supported (their batches are not independent prompt groups)")
  if a.poll_s < 0 or a.timeout_s <= 0:
    raise SetupError("async_rl.poll_s must be >= 0 (0: blocking waits) and async_rl.timeout_s "
                     "> 0")


# --------------------------------------------------------------------------
# Bookkeeping: the ledger, the staleness rule, unit contents.
# --------------------------------------------------------------------------


def capacity(*, version: int, launch_version: int, claims: int, consumed: int, dropped: int,
             units_per_step: int, max_staleness: int, max_in_flight: int) -> int:
  """How many more units may start now (AReaL's rule, module docstring).

  Args:
    version: the trainer's version v (RL steps done).
    launch_version: v when this launch of the system began (units before it were trained on).
    claims: units claimed by workers since the launch (running, ready, consumed or dropped).
    consumed, dropped: units of those the trainer took into a batch / dropped as stale.
    units_per_step: B. max_staleness: η. max_in_flight: cap on ready + running (0: none).
  """
  accepted_and_running = launch_version * units_per_step + claims - dropped
  by_staleness = (max_staleness + version + 1) * units_per_step - accepted_and_running
  if not max_in_flight:
    return by_staleness
  in_flight = claims - consumed - dropped
  return min(max_in_flight - in_flight, by_staleness)


def _ranges(values: Iterable[int]) -> list[list[int]]:
  """Sorted ints as [start, stop) runs (a checkpoint's consumed units stay small)."""
  out: list[list[int]] = []
  for v in sorted(values):
    if out and out[-1][1] == v:
      out[-1][1] = v + 1
    else:
      out.append([v, v + 1])
  return out


def _from_ranges(runs: Iterable[Iterable[int]]) -> set[int]:
  return {v for a, b in runs for v in range(a, b)}


def nth_free(k: int, taken: Iterable[int]) -> int:
  """The k-th (0-based) non-negative integer not in `taken` (sorted or not)."""
  s = k
  for t in sorted(taken):
    if t <= s:
      s += 1
    else:
      break
  return s


@dataclasses.dataclass
class Ledger:
  """The trainer's record of rollout units, checkpointed in place of the loader position
  (`get_state` / `set_state`, like grain's iterator): the consumed unit indices and the
  number dropped as stale, over the whole run."""
  consumed: set = dataclasses.field(default_factory=set)
  dropped: int = 0

  def get_state(self) -> dict:
    return {"consumed": _ranges(self.consumed), "dropped": self.dropped}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self.consumed = _from_ranges(state["consumed"])
    self.dropped = int(state["dropped"])


def unit_examples(train: list[dict], unit: int, u: int, seed: int) -> list[dict]:
  """The u examples of unit `unit`: global prompts unit·u .. unit·u+u−1 of the train split,
  reshuffled every epoch (numpy `default_rng([seed, epoch])`)."""
  n, out, perms = len(train), [], {}
  for i in range(unit * u, unit * u + u):
    epoch, pos = divmod(i, n)
    if epoch not in perms:  # one permutation per epoch the unit touches (at most two)
      perms[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
    out.append(train[int(perms[epoch][pos])])
  return out


def pack(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> bytes:
  """Arrays (any dtype jnp knows, bfloat16 included) and a JSON header as one byte string."""
  names = sorted(arrays)
  arrs = [np.asarray(arrays[k]) for k in names]  # tobytes() writes C order
  head = json.dumps({"meta": meta, "arrays": [[k, a.dtype.name, list(a.shape)]
                                              for k, a in zip(names, arrs)]}).encode()
  buf = io.BytesIO()
  buf.write(len(head).to_bytes(8, "little"))
  buf.write(head)
  for a in arrs:
    buf.write(a.tobytes())
  return buf.getvalue()


def unpack(data: bytes) -> tuple[dict[str, np.ndarray], dict]:
  """Inverse of `pack`."""
  n = int.from_bytes(data[:8], "little")
  head = json.loads(data[8:8 + n])
  off, arrays = 8 + n, {}
  for name, dtype, shape in head["arrays"]:
    dt = jnp.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    arrays[name] = np.frombuffer(data, dt, count=int(np.prod(shape, dtype=np.int64)),
                                 offset=off).reshape(shape)
    off += size
  return arrays, head["meta"]


def params_nbytes(params) -> int:
  """Bytes of a parameter tree (its leaves' sizes; nothing is copied)."""
  return sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(params))


def pack_params(params, path: str | None = None) -> bytes:
  """The store value that publishes `params`: the arrays themselves, or with `path` a
  pointer to them written once to a safetensors file at `path` (a shared directory on a
  cluster), complete before it is named: written to `path`.tmp, then renamed."""
  host = {f"{i:06d}": np.asarray(x)
          for i, x in enumerate(jax.tree.leaves(parallel.to_host(params)))}
  if path is None:
    return pack(host, {})
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  os.makedirs(os.path.dirname(path), exist_ok=True)
  safetensors.numpy.save_file(host, path + ".tmp")
  os.replace(path + ".tmp", path)
  return pack({}, {"file": path, "arrays": len(host)})


def unpack_params(data: bytes, like):
  """Parameters with the structure and shardings of `like` (read from the file a pointer
  names; FileNotFoundError when it was deleted meanwhile)."""
  arrays, meta = unpack(data)
  if "file" in meta:
    import safetensors.numpy  # pylint: disable=g-import-not-at-top
    arrays = safetensors.numpy.load_file(meta["file"])
  leaves = [arrays[k] for k in sorted(arrays)]
  like_leaves, treedef = jax.tree.flatten(like)
  if len(leaves) != len(like_leaves):
    raise CoordinationError(f"published parameters have {len(leaves)} arrays, this worker's "
                            f"model {len(like_leaves)}")
  return jax.tree.unflatten(treedef, [jax.device_put(x, y.sharding)
                                      for x, y in zip(leaves, like_leaves)])


def _columns(examples: list[dict]) -> dict:
  return tasks_lib.collate([tasks_lib.as_example(e) for e in examples])


def _split_columns(cols: Mapping[str, Any]) -> tuple[dict, dict]:
  """Example columns as (arrays, JSON lists of texts)."""
  arrays, texts = {}, {}
  for k, v in cols.items():
    if isinstance(v, list):
      texts[k] = [str(x) for x in v]
    else:
      arrays[k] = np.asarray(v)
  return arrays, texts


# --------------------------------------------------------------------------
# Keys of the store.
# --------------------------------------------------------------------------

_PLAN, _STATE, _STOP, _CLAIMS = "async/plan", "async/state", "async/stop", "async/claims"
_NREADY = "async/nready"
# Waiting. The service has one blocking call, a get of a key not yet set; it cannot wait on a
# directory or on a new value of a key. So every event a process waits for is a new key: the
# n-th ready unit is announced under _ready_key(n) (n from an atomic counter, the value the
# unit index) and the trainer's n-th state under _state_seq_key(n); a waiter blocks on the
# next number (async_rl.poll_s > 0 polls instead, for comparison).
_STATE_SEQ_KEPT = 64   # state notices kept (a gated worker waits on the one after its state)
_GATE_RECHECK_S = 60.0  # a gated worker re-reads the state at least this often


def _state_seq_key(n: int) -> str:
  return f"async/stateseq/{n}"


def _params_key(v: int) -> str:
  return f"async/params/{v}"


def _unit_key(s: int) -> str:
  return f"async/unit/{s}"


def _ready_key(n: int) -> str:
  return f"async/ready/{n}"


# --------------------------------------------------------------------------
# The worker.
# --------------------------------------------------------------------------


def worker_config(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A worker's config: the unit as its batch (u prompts, one minibatch), its own mesh."""
  w = c.copy_and_resolve_references()
  with w.unlocked():
    w.prompts_per_step = c.async_rl.groups_per_rollout
    w.num_minibatches = 1
    w.mesh = c.async_rl.worker_mesh
    w.progress = False
  return w


class _Params:
  """What a worker's stages read of a train state: the parameters and their version (the
  `policy_version` producer reads `step`)."""

  def __init__(self, params, step: int):
    self.params, self.step = params, step


@dataclasses.dataclass
class _Held:
  """A worker's copy of the policy: its version and parameters."""
  coord: Coordinator
  a: Any
  like: Any
  version: int = -1
  params: Any = None

  def newest(self, state: Mapping[str, Any]) -> bool:
    """Fetches the parameters `state` names when newer than the held ones (reading the state
    again if they were deleted meanwhile); returns whether they changed."""
    changed = False
    while state["version"] > self.version:
      raw = self.coord.try_get(_params_key(state["version"]))
      try:
        params = None if raw is None else unpack_params(raw, self.like)
      except FileNotFoundError as e:  # deleted when two newer versions were out, or unseen
        params, missing = None, e.filename
      if params is not None:
        self.version, self.params = state["version"], params
        changed = True
        continue
      newer = self.coord.get_json(_STATE, self.a.timeout_s)
      if raw is not None and params is None and newer["version"] == state["version"]:
        raise CoordinationError(
            f"parameter file {missing} of the current version is not on this host: "
            "async_rl.params_dir must be a directory every process sees (or "
            "async_rl.params_file_mb=-1: parameters through the store)")
      state = newer
    return changed

  def refresh(self, turn: int):
    """Between turns of a unit (`async_rl.interrupt`): the newest parameters, or None."""
    del turn
    return self.params if self.newest(self.coord.get_json(_STATE, self.a.timeout_s)) else None


def run_worker(c: ml_collections.ConfigDict, workdir: str, coord: Coordinator) -> None:
  """Samples rollout units until the trainer says stop (module docstring)."""
  a = c.async_rl
  wdir = os.path.join(workdir, "async", f"worker_{coord.process_id}")
  runner, rs = loop.setup(worker_config(c), wdir)
  stages = [st for st in runner.stages if st.phase in WORKER_PHASES]
  like = rs.train.params
  plan = coord.get_json(_PLAN, a.timeout_s)  # after the trainer's warm-up / restore
  skip = _from_ranges(plan["skip"])
  B, u = c.prompts_per_step // a.groups_per_rollout, a.groups_per_rollout
  held = _Held(coord, a, like)
  tok, data = runner.data.tokenizer, runner.data
  while coord.try_get(_STOP) is None:
    k = coord.increment(_CLAIMS) - 1
    s = nth_free(k, skip)
    t0 = time.perf_counter()
    state = coord.get_json(_STATE, a.timeout_s)
    while capacity(version=state["version"], launch_version=plan["launch_version"], claims=k,
                   consumed=state["consumed"], dropped=state["dropped"], units_per_step=B,
                   max_staleness=a.max_staleness, max_in_flight=a.max_in_flight) <= 0:
      if coord.try_get(_STOP) is not None:  # the staleness gate: wait for the next state
        return _worker_end(coord, a)
      try:
        coord.wait_key(_state_seq_key(state["seq"] + 1), min(a.timeout_s, _GATE_RECHECK_S),
                       a.poll_s)
      except CoordinationError:
        pass  # no new state for a while: read it again (a dead trainer fails the read)
      state = coord.get_json(_STATE, a.timeout_s)
    wait_s = time.perf_counter() - t0
    held.newest(state)
    version = held.version
    t0 = time.perf_counter()
    examples = unit_examples(data.train, s, u, c.seed)
    cols = _columns(examples)
    toks, pmask = tasks_lib.encode_prompts(tok, cols["prompt"], data.max_prompt_len)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(c.seed), _ROLLOUT_SALT), s)
    ctx = producers.StepContext(key=key, examples=cols, prompt_tokens=toks, prompt_mask=pmask,
                                refresh=held.refresh if a.interrupt else None)
    batch, times = {}, {}
    loop.run_stages(stages, _Params(held.params, version), batch, ctx, times)
    host = parallel.to_host({n: v for n, v in batch.items() if n in credit.CONTRACT})
    arrays = {f"f/{n}": np.asarray(v) for n, v in host.items()}
    # Every row of an interrupted unit carries its oldest version (module docstring).
    arrays["f/policy_version"] = np.full(len(host["tokens"]), version, np.int32)
    arrays.update({f"h/{n}": np.asarray(v) for n, v in batch["host"].items()})
    arrays["x/logprob_raw"] = np.asarray(parallel.to_host(batch["logprob_raw"]))
    arrays["p/tokens"], arrays["p/mask"] = toks, pmask
    ex_arrays, ex_texts = _split_columns(cols)
    arrays.update({f"e/{n}": v for n, v in ex_arrays.items()})
    meta = {"unit": s, "version": version, "version_last": held.version,
            "worker": coord.process_id,
            "texts": list(batch.get("texts") or []), "example_texts": ex_texts,
            "metrics": {k: float(v) for k, v in ctx.metrics.items()},
            "times": times, "gen_s": time.perf_counter() - t0, "wait_s": wait_s}
    coord.set(_unit_key(s), pack(arrays, meta))
    coord.set(_ready_key(coord.increment(_NREADY)), str(s))
  _worker_end(coord, a)


def _worker_end(coord: Coordinator, a) -> None:
  coord.barrier("async/end", a.timeout_s)
  coord.close()


# --------------------------------------------------------------------------
# The trainer.
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _Feed:
  """The trainer's side of the store: ready units, what was taken, the published state."""
  coord: Coordinator
  a: Any
  units_per_step: int
  launch_version: int
  consumed: int = 0        # since this launch
  dropped: int = 0         # since this launch
  buffer: dict = dataclasses.field(default_factory=dict)  # unit -> (arrays, meta)
  seen: int = 0            # ready notices taken (since this launch)
  state_seq: int = 0       # states published (since this launch)
  params_dir: str = ""     # where parameter files go (async_rl.params_dir resolved)

  def params_file(self, params, version: int) -> str | None:
    """The file that carries `version`'s parameters, or None when they go through the
    store (smaller than async_rl.params_file_mb)."""
    mb = self.a.params_file_mb
    if mb < 0 or params_nbytes(params) < mb * 2**20:
      return None
    return os.path.join(self.params_dir, f"params_{version}.safetensors")

  def publish(self, params, version: int) -> None:
    """The parameters of `version`, then the state that names it; older copies deleted."""
    path = self.params_file(params, version)
    self.coord.set(_params_key(version), pack_params(params, path))
    self.publish_state(version)
    for old in (version - 2, version - 3):
      if old >= 0:
        try:
          self.coord.delete(_params_key(old))
        except Exception:  # pylint: disable=broad-except
          pass
        if path is not None and os.path.exists(p := self.params_file(params, old)):
          os.remove(p)  # a worker that opened it still reads it (POSIX)

  def remove_files(self) -> None:
    """The run's parameter files (this launch's and any a killed launch left), once every
    worker has stopped."""
    if os.path.isdir(self.params_dir):
      for name in os.listdir(self.params_dir):
        if name.startswith("params_") and name.endswith(".safetensors"):
          os.remove(os.path.join(self.params_dir, name))

  def publish_state(self, version: int) -> None:
    """The state, then its notice (which wakes the workers the staleness gate holds)."""
    self.state_seq += 1
    self.coord.set_json(_STATE, {"version": version, "consumed": self.consumed,
                                 "dropped": self.dropped, "seq": self.state_seq})
    self.coord.set(_state_seq_key(self.state_seq), b"1")
    if self.state_seq > _STATE_SEQ_KEPT:
      self.coord.delete(_state_seq_key(self.state_seq - _STATE_SEQ_KEPT))

  def _arrive(self, notice: bytes) -> None:
    """The unit a ready notice names, moved from the store into the buffer."""
    self.seen += 1
    s = int(notice)
    self.buffer[s] = unpack(self.coord.get(_unit_key(s), self.a.timeout_s))
    self.coord.delete(_unit_key(s))
    self.coord.delete(_ready_key(self.seen))

  def poll(self) -> None:
    """Moves every unit announced so far into the buffer (no waiting)."""
    while (notice := self.coord.try_get(_ready_key(self.seen + 1))) is not None:
      self._arrive(notice)

  def take(self, version: int, ledger: Ledger) -> tuple[list, float, int, float]:
    """B units for the step at `version` (lowest unit index first among the ready ones),
    waiting as long as needed; returns (units, seconds waited, units dropped as stale,
    the process's CPU seconds while waiting)."""
    t0, cpu0, dropped = time.perf_counter(), time.process_time(), 0
    chosen: list = []
    while len(chosen) < self.units_per_step:
      self.poll()
      for s in sorted(self.buffer):
        if len(chosen) == self.units_per_step:
          break
        arrays, meta = self.buffer.pop(s)
        ledger.consumed.add(s)
        if self.a.drop_stale and version - meta["version"] > self.a.max_staleness:
          dropped += 1
          self.dropped += 1
          ledger.dropped += 1
          continue
        self.consumed += 1
        chosen.append((arrays, meta))
      if len(chosen) < self.units_per_step:  # block until the next unit is announced
        left = self.a.timeout_s - (time.perf_counter() - t0)
        try:
          if left <= 0:
            raise CoordinationError("timed out")
          self._arrive(self.coord.wait_key(_ready_key(self.seen + 1), left, self.a.poll_s))
        except CoordinationError:
          raise CoordinationError(
              f"no rollout unit arrived for {self.a.timeout_s:.0f}s") from None
    self.publish_state(version)
    return chosen, time.perf_counter() - t0, dropped, time.process_time() - cpu0


def assemble(run: loop.Runner, rs: loop.RunState, units: list) -> tuple[producers.StepContext,
                                                                       dict, dict]:
  """The step's context and batch from B units (groups renumbered unit by unit), and the
  units' stamps: versions and worker metrics."""
  c, u = run.c, run.c.async_rl.groups_per_rollout
  cat: dict[str, list] = {}
  texts, ex_texts = [], {}
  for j, (arrays, meta) in enumerate(units):
    for name, x in arrays.items():
      if name in ("f/group_id", "h/group_id"):
        x = x + j * u
      cat.setdefault(name, []).append(x)
    texts += meta["texts"]
    for k, v in meta["example_texts"].items():
      ex_texts.setdefault(k, []).extend(v)
  arr = {k: np.concatenate(v) for k, v in cat.items()}
  part = lambda prefix: {k[len(prefix):]: v for k, v in arr.items() if k.startswith(prefix)}
  examples = dict(part("e/"), **ex_texts)
  key = jax.random.fold_in(jax.random.wrap_key_data(loop._key_data(c.seed)), rs.step)  # pylint: disable=protected-access
  ctx = producers.StepContext(key=key, examples=examples, prompt_tokens=arr["p/tokens"],
                              prompt_mask=arr["p/mask"], ref_params=rs.ref_params,
                              learners=dict(rs.learners))
  h = part("h/")
  runner_fields = {  # what the workers' rollout producers handed on besides contract fields
      "host": h, "logprob_raw": parallel.shard_batch(arr["x/logprob_raw"], run.mesh),
      "attn_mask": parallel.shard_batch(h["prompt_mask"] | h["response_mask"] | h["obs_mask"],
                                        run.mesh)}
  if texts:
    runner_fields["texts"] = texts
  versions = np.asarray([m["version"] for _, m in units])
  last = np.asarray([m["version_last"] for _, m in units])
  worker = {}
  for _, m in units:
    for k, v in m["metrics"].items():
      worker.setdefault(k, []).append(v)
  ctx.metrics.update({k: float(np.mean(v)) for k, v in worker.items()})
  stamps = {"versions": versions, "versions_last": last, "gen_s": [m["gen_s"] for _, m in units],
            "wait_s": [m["wait_s"] for _, m in units]}
  return ctx, dict(parallel.shard_batch(part("f/"), run.mesh), **runner_fields), stamps


def run_trainer(c: ml_collections.ConfigDict, workdir: str, coord: Coordinator,
                runner=None, rs=None) -> dict[str, Any]:
  """The trainer (process 0): `loop.run` with batches assembled from the workers' units."""
  t_start = time.perf_counter()
  a = c.async_rl
  if runner is None:
    runner, rs = loop.setup(c, workdir)
  ledger = Ledger()
  rs = dataclasses.replace(rs, loader=ledger)
  t0 = time.perf_counter()
  rs = loop.restore_or_warm_up(runner, rs)
  warm_up_time = time.perf_counter() - t0
  B = c.prompts_per_step // a.groups_per_rollout
  feed = _Feed(coord, a, B, launch_version=rs.step,
               params_dir=a.params_dir or os.path.join(workdir, "async", "params"))
  coord.set_json(_PLAN, {"launch_version": rs.step, "skip": _ranges(ledger.consumed)})
  feed.publish(rs.train.params, rs.step)
  trainer_stages = [st for st in runner.stages if st.phase not in WORKER_PHASES]
  resumed = rs.step > 0
  out = (loop.Outputs.open(workdir, resume_step=rs.step if resumed else None, t0=t_start)
         if runner.is_main else None)
  bar = loop.progress.ProgressBar(c.steps, initial=rs.step, desc="RL",
                                  disable=None if c.progress else True,
                                  every=c.get("log_every", 0), log=runner.log,
                                  line_fields=loop.progress.RL_LINE_FIELDS,
                                  quiet=not runner.is_main)
  if not resumed:
    t0 = time.perf_counter()
    ev = loop._evaluate(runner, rs)  # pylint: disable=protected-access
    ev["eval_time"] = time.perf_counter() - t0
    if out:
      out.metrics.write(0, dict(ev, warm_up_time=warm_up_time, wall_time=out.wall_time()))
  waited = 0.0
  t_loop = time.perf_counter()
  while rs.step < c.steps:
    units, wait_s, dropped, wait_cpu_s = feed.take(rs.step, ledger)
    waited += wait_s
    t_step = time.perf_counter()
    ctx, batch, stamps = assemble(runner, rs, units)
    times = {}
    loop.run_stages(trainer_stages, rs.train, batch, ctx, times)
    version = rs.step
    rs, metrics = loop.learn(runner, rs, ctx, batch, times, t_step)
    t0 = time.perf_counter()
    feed.publish(rs.train.params, rs.step)
    stale = version - np.asarray(parallel.to_host(batch["policy_version"]))
    metrics.update(
        async_wait_s=wait_s, async_wait_cpu_s=wait_cpu_s,
        async_publish_s=time.perf_counter() - t0,
        async_staleness_mean=float(stale.mean()), async_staleness_max=float(stale.max()),
        async_interrupted=float(np.mean(stamps["versions_last"] > stamps["versions"])),
        async_dropped=float(dropped), async_buffered=float(len(feed.buffer)),
        async_unit_gen_s=float(np.mean(stamps["gen_s"])),
        async_unit_gate_s=float(np.mean(stamps["wait_s"])),
        trainer_idle_frac=waited / max(time.perf_counter() - t_loop, 1e-9))
    loop.record(runner, rs, metrics, out, bar)
  bar.close()
  coord.set(_STOP, b"1")
  feed.publish_state(rs.step)  # wakes the workers the staleness gate holds
  result = loop.finish(runner, rs, out)
  coord.barrier("async/end", a.timeout_s)
  coord.close()
  feed.remove_files()
  return result


# --------------------------------------------------------------------------
# Processes.
# --------------------------------------------------------------------------


def _watch(procs: list[subprocess.Popen], logs: list[str]) -> None:
  """Ends the trainer when a worker it launched fails (its log's tail on stderr)."""
  while True:
    for p, log in zip(procs, logs):
      rc = p.poll()
      if rc not in (None, 0):
        with open(log) as f:
          tail = f.read()[-3000:]
        print(f"error: rollout worker {log} exited with {rc}:\n{tail}", file=sys.stderr)
        os._exit(3)  # pylint: disable=protected-access
    if all(p.poll() == 0 for p in procs):
      return
    time.sleep(0.5)


def main(c: ml_collections.ConfigDict, workdir: str, *, argv: list[str],
         coordinator: str | None, num_processes: int, process_id: int) -> dict | None:
  """The entry point of `experiments.run` under `--config.async_rollouts=True`.

  Without `coordinator`, launches `c.async_rl.num_workers` worker processes on this machine
  (the same command line plus the coordination flags; logs in <workdir>/async/) and trains
  in this one. With it, this process takes its role by `process_id` (0 trains).
  """
  check_async(c)
  a = c.async_rl
  if coordinator is None:
    runner, rs = loop.setup(c, workdir)  # every refusal before a worker starts
    address, n = f"localhost:{free_port()}", a.num_workers + 1
    os.makedirs(os.path.join(workdir, "async"), exist_ok=True)
    procs, logs = [], []
    for i in range(1, n):
      logs.append(os.path.join(workdir, "async", f"worker_{i}.log"))
      with open(logs[-1], "w") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "experiments.run", *argv, f"--coordinator={address}",
             f"--num_processes={n}", f"--process_id={i}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd()))
    threading.Thread(target=_watch, args=(procs, logs), daemon=True).start()
    coord = Coordinator(address, n, 0, heartbeat_s=a.heartbeat_s)
    result = run_trainer(c, workdir, coord, runner, rs)
    for p in procs:
      p.wait(timeout=a.timeout_s)
    return result
  if num_processes != a.num_workers + 1:
    raise SetupError(f"--num_processes={num_processes}: an asynchronous run has "
                     f"async_rl.num_workers + 1 = {a.num_workers + 1} processes")
  coord = Coordinator(coordinator, num_processes, process_id, heartbeat_s=a.heartbeat_s)
  if process_id == 0:
    return run_trainer(c, workdir, coord)
  run_worker(c, workdir, coord)
  return None
