"""Crash-safe checkpoints of the training state for the experiment runner.

A thin wrapper around orbax-checkpoint's `CheckpointManager` (tested with
orbax-checkpoint 0.12.8). One checkpoint per saved step holds two items:

* ``state``: an arbitrary pytree of arrays (params, optimizer state, PRNG key,
  step counter, estimator state such as running statistics), possibly sharded
  on a mesh, written with `ocp.args.StandardSave`;
* ``meta``: a JSON dict (data-iterator position from grain's ``get_state()``,
  config hash, metrics so far, ...), written with `ocp.args.JsonSave`.

Crash safety. Orbax writes every step into ``<step>.orbax-checkpoint-tmp-*``
and renames it to ``<step>`` only when all items are written, so a process
killed during a save leaves a tmp directory that is never listed as a step.
On top of that, once a save has finished this module writes
``<step>/credit_manifest.json`` (atomically, tmp + `os.replace`) with the
relative path, size and CRC-32 of the content of every file in the step
(``checksum=False`` leaves the CRC out). `Checkpointer.restore_latest` tries
steps newest first and skips, with a logged warning naming the step and the
reason:

* a step whose files do not match its manifest (missing, truncated, or changed
  in place: same size, other bytes, caught by the CRC-32, which orbax would
  otherwise read back as numbers, e.g. NaN parameters);
* a step orbax fails to read (garbage, empty directory, missing item);
* a ``meta`` item that is not a JSON object.

Skipped steps newer than the restored one are moved to ``<dir>/_corrupt/`` so
that the resumed run can save those step numbers again (orbax refuses to save
a step at or below the latest step on disk). A checkpoint whose files are fine
but whose tree structure or array shapes differ from ``abstract_state`` is not
corruption but a changed config: that raises `CheckpointMismatchError`
instead of silently falling back. Dtypes are not compared: orbax casts to the
requested dtype on restore (e.g. float32 on disk into a bfloat16 abstract).

PRNG keys: typed keys (`jax.random.key`) are saved by orbax 0.12.8 as their
``key_data`` (uint32) and restored as typed keys of the abstract dtype, so no
conversion is needed; legacy uint32 keys are plain arrays.

Scope: local or mounted (NFS-style) filesystems. On several processes
(`jax.distributed`), every process must call `save` / `restore_latest`;
manifest writes and quarantine moves happen on process 0 only.

Example::

  ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=3)
  restored = ckpt.restore_latest(abstract_like(state))
  if restored is not None:
    start_step, state, meta = restored
  ...
  ckpt.save(step, state=state, meta={"data": loader_state, "config": h})
"""
from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)

MANIFEST_NAME = "credit_manifest.json"
QUARANTINE_DIR = "_corrupt"
_TMP_MARKER = ".orbax-checkpoint-tmp"
_MANIFEST_VERSION = 1


class CheckpointError(RuntimeError):
  """Checkpoints exist on disk but none of them can be restored."""


class CheckpointMismatchError(ValueError):
  """A readable checkpoint does not match the requested abstract state."""


class Restored(NamedTuple):
  """What `Checkpointer.restore_latest` returns; unpacks as a 3-tuple."""
  step: int
  state: Any
  meta: dict[str, Any]


def abstract_like(tree: Any) -> Any:
  """Maps every `jax.Array` leaf to a `jax.ShapeDtypeStruct` with its sharding.

  Non-array leaves (numpy arrays, Python scalars) are left as they are; orbax
  restores them by value type.

  Args:
    tree: a pytree, e.g. the freshly initialised training state.

  Returns:
    The same tree with `ShapeDtypeStruct(shape, dtype, sharding=...)` leaves,
    ready for `Checkpointer.restore_latest`.
  """
  def one(x):
    if isinstance(x, jax.Array):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x
  return jax.tree.map(one, tree)


def _json_default(x: Any) -> Any:
  if isinstance(x, (np.generic, np.ndarray, jax.Array)):
    arr = np.asarray(x)
    return arr.item() if arr.ndim == 0 else arr.tolist()
  raise TypeError(f"meta value of type {type(x).__name__} is not JSON serialisable")


def _normalise_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
  if meta is None:
    return {}
  if not isinstance(meta, Mapping):
    raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")
  # Round trip now: fail before anything is written, convert numpy/jax values.
  return json.loads(json.dumps(dict(meta), default=_json_default))


def _file_crc32(path: str) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(1 << 22):
      crc = zlib.crc32(chunk, crc)
  return crc


def _list_files(step_dir: str) -> list[str]:
  out = []
  for root, _, files in os.walk(step_dir):
    for name in files:
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if rel != MANIFEST_NAME and not name.startswith(MANIFEST_NAME + "."):
        out.append(rel)
  return sorted(out)


def _write_atomic(path: str, text: str) -> None:
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _leaf_shape(x: Any) -> tuple[int, ...] | None:
  """Shape as stored on disk: typed PRNG keys are stored as their key data."""
  if isinstance(x, (jax.ShapeDtypeStruct, jax.Array)):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
      return tuple(jax.eval_shape(jax.random.key_data, sds).shape)
    return tuple(x.shape)
  shape = getattr(x, "shape", None)
  return None if shape is None else tuple(shape)


class Checkpointer:
  """Saves and restores ``(state, meta)`` per step; skips corrupt checkpoints.

  Args:
    directory: where step directories live (created if missing).
    max_to_keep: number of most recent checkpoints kept (None keeps all).
    save_interval_steps: `save` writes only steps that are multiples of this,
      the first save of a directory, and any step with ``force=True``.
    async_save: if True, `save` returns once the arrays are copied off the
      device and writing continues in the background; call `wait()` (or the
      next `save`, or `close`) before relying on the checkpoint. If False
      (default), `save` returns only when the checkpoint is complete on disk,
      so a SIGKILL after `save` returns still leaves it restorable.
    checksum: store a CRC-32 of every file in the manifest (reads the whole
      checkpoint once more at save; zlib's CRC runs at about a GB/s). A CRC in a
      manifest is always verified at restore, whatever this flag. False: the
      manifest holds presence and sizes only, and damage that keeps a file's
      size is caught only when orbax/tensorstore fails to decode the data.
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3,
               save_interval_steps: int = 1, async_save: bool = False,
               checksum: bool = True):
    self.directory = os.path.abspath(os.fspath(directory))
    self.checksum = checksum
    self.async_save = async_save
    self._pending: list[int] = []
    self._warned: set[str] = set()
    self._warn_partial_dirs()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        save_interval_steps=save_interval_steps,
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=True,
        create=True)
    self._mngr = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})

  # ------------------------------------------------------------------ saving

  def save(self, step: int, *, state: Any, meta: Mapping[str, Any] | None = None,
           force: bool = False) -> bool:
    """Writes a checkpoint of `state` and `meta` for `step`.

    Args:
      step: the training step (non-negative int). Must be larger than every
        step already on disk; saving the latest step again is a no-op.
      state: a pytree of arrays (jax arrays, possibly sharded; numpy arrays;
        typed or legacy PRNG keys; Python scalars).
      meta: a JSON-serialisable mapping; numpy/jax scalars and arrays are
        converted to Python numbers and lists. Tuples come back as lists and
        non-string keys as strings (JSON).
      force: save even if `step` is not a multiple of `save_interval_steps`.

    Returns:
      True if a checkpoint was written (or, with ``async_save``, started).

    Raises:
      ValueError: if `step` is lower than the latest step on disk.
      TypeError: if `meta` is not JSON-serialisable (nothing is written).
    """
    step = int(step)
    meta = _normalise_meta(meta)
    self._finish_pending()
    latest = self._mngr.latest_step()
    if latest is not None and step <= latest:
      if step == latest:
        logger.info("Checkpoint for step %d already exists in %s; not saving "
                    "it again.", step, self.directory)
        return False
      raise ValueError(
          f"Cannot save step {step}: {self.directory} already holds step "
          f"{latest}. Resume with restore_latest() or use a new directory.")
    saved = self._mngr.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                meta=ocp.args.JsonSave(meta)),
        force=force)
    if not saved:
      return False
    self._pending.append(step)
    if not self.async_save:
      self._finish_pending()
    return True

  def wait(self) -> None:
    """Blocks until every started save is complete and has its manifest."""
    self._finish_pending()

  def _finish_pending(self) -> None:
    self._mngr.wait_until_finished()
    pending, self._pending = self._pending, []
    if jax.process_index() != 0:
      return
    for step in pending:
      step_dir = self._step_dir(step)
      if os.path.isdir(step_dir):  # may already be garbage-collected
        self._write_manifest(step, step_dir)

  def _write_manifest(self, step: int, step_dir: str) -> None:
    files = {}
    for rel in _list_files(step_dir):
      full = os.path.join(step_dir, rel)
      entry: dict[str, int] = {"size": os.path.getsize(full)}
      if self.checksum:
        entry["crc32"] = _file_crc32(full)
      files[rel] = entry
    manifest = {"version": _MANIFEST_VERSION, "step": step, "files": files}
    _write_atomic(os.path.join(step_dir, MANIFEST_NAME),
                  json.dumps(manifest, sort_keys=True))

  # --------------------------------------------------------------- restoring

  def all_steps(self) -> list[int]:
    """Finalised steps on disk, ascending (not yet checked for corruption)."""
    self._mngr.reload()
    return sorted(int(s) for s in self._mngr.all_steps())

  def latest_step(self) -> int | None:
    """The newest finalised step on disk, or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def restore_latest(self, abstract_state: Any) -> Restored | None:
    """Restores the newest complete checkpoint.

    Steps are tried newest first; a corrupt or partial one is skipped with a
    warning that names the step and the reason, and the previous one is tried.
    Skipped steps newer than the restored one are moved to ``_corrupt/``.

    Args:
      abstract_state: the pytree to restore into, with `jax.ShapeDtypeStruct`
        leaves carrying shardings (see `abstract_like`); restored arrays get
        exactly these shardings and dtypes.

    Returns:
      `Restored(step, state, meta)`, or None when the directory holds no
      finalised checkpoint (orbax tmp directories of interrupted saves do not
      count).

    Raises:
      CheckpointMismatchError: the newest readable checkpoint has a different
        tree structure or array shapes than `abstract_state`.
      CheckpointError: checkpoints exist but none can be restored; nothing is
        moved, so that the files can be inspected.
    """
    self._finish_pending()
    self._warn_partial_dirs()
    steps = self.all_steps()
    failures: list[tuple[int, str]] = []
    for step in reversed(steps):
      reason, result = self._try_restore(step, abstract_state)
      if result is not None:
        if failures:
          self._quarantine([s for s, _ in failures])
        logger.info("Restored checkpoint step %d from %s.", step, self.directory)
        return result
      logger.warning(
          "Skipping checkpoint step %d in %s: %s. Falling back to an earlier "
          "checkpoint.", step, self.directory, reason)
      failures.append((step, reason))
    if failures:
      details = "; ".join(f"step {s}: {r}" for s, r in failures)
      raise CheckpointError(
          f"No restorable checkpoint in {self.directory} ({details}). Move or "
          "delete the directory to start from scratch.")
    return None

  def _try_restore(self, step: int, abstract_state: Any) -> tuple[str, Restored | None]:
    step_dir = self._step_dir(step)
    problem = self._verify_manifest(step_dir)
    if problem:
      return problem, None
    self._check_structure(step, abstract_state)
    try:
      restored = self._mngr.restore(
          step, args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract_state),
              meta=ocp.args.JsonRestore()))
    except Exception as e:  # noqa: BLE001 - any read failure means "corrupt"
      msg = " ".join(str(e).split())
      if len(msg) > 300:
        msg = msg[:300] + "..."
      return f"orbax could not read it ({type(e).__name__}: {msg})", None
    meta = restored["meta"]
    if not isinstance(meta, dict):
      return f"meta item is a {type(meta).__name__}, not a JSON object", None
    return "", Restored(step, restored["state"], meta)

  def _verify_manifest(self, step_dir: str) -> str:
    """Returns '' if the step's files match its manifest, else the reason."""
    path = os.path.join(step_dir, MANIFEST_NAME)
    if not os.path.exists(path):
      # Killed between orbax's final rename and the manifest write, or written
      # by plain orbax: the rename is atomic, so let orbax decide.
      logger.info("No %s in %s; relying on orbax to validate it.",
                  MANIFEST_NAME, step_dir)
      return ""
    try:
      with open(path) as f:
        manifest = json.load(f)
      files = manifest["files"]
      if not isinstance(files, dict):
        raise TypeError("'files' is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
      return f"unreadable manifest {MANIFEST_NAME} ({e})"
    for rel, entry in sorted(files.items()):
      full = os.path.join(step_dir, rel)
      if not os.path.isfile(full):
        return f"file {rel} is missing"
      size = os.path.getsize(full)
      if size != entry.get("size"):
        return f"file {rel} has {size} bytes, expected {entry.get('size')} (truncated?)"
      if "crc32" in entry and _file_crc32(full) != entry["crc32"]:
        return f"file {rel} fails its CRC-32 check"
    return ""

  def _check_structure(self, step: int, abstract_state: Any) -> None:
    """Raises CheckpointMismatchError if tree paths or shapes differ."""
    try:
      stored = self._mngr.item_metadata(step)["state"]
      stored = getattr(stored, "tree", stored)
      stored_flat = ocp.tree.to_flat_dict(stored)
    except Exception as e:  # noqa: BLE001 - unreadable: restore will decide
      logger.info("Could not read metadata of step %d (%s); skipping the "
                  "structure check.", step, e)
      return
    if not stored_flat:
      return  # nothing readable; restore will fail and report it
    wanted_flat = ocp.tree.to_flat_dict(abstract_state)
    missing = sorted(set(wanted_flat) - set(stored_flat))
    extra = sorted(set(stored_flat) - set(wanted_flat))
    if missing or extra:
      raise CheckpointMismatchError(
          f"Checkpoint step {step} in {self.directory} has a different state "
          f"structure: not in checkpoint {['/'.join(k) for k in missing][:10]}, "
          f"not in abstract_state {['/'.join(k) for k in extra][:10]}.")
    for key, want in wanted_flat.items():
      w, s = _leaf_shape(want), _leaf_shape(stored_flat[key])
      if w is not None and s is not None and w != s:
        raise CheckpointMismatchError(
            f"Checkpoint step {step} in {self.directory}: {'/'.join(key)} has "
            f"shape {s} on disk but {w} in abstract_state.")

  def _quarantine(self, steps: list[int]) -> None:
    if jax.process_index() == 0:
      qdir = os.path.join(self.directory, QUARANTINE_DIR)
      os.makedirs(qdir, exist_ok=True)
      stamp = time.strftime("%Y%m%d-%H%M%S")
      for step in steps:
        src = self._step_dir(step)
        if os.path.exists(src):
          dst = os.path.join(qdir, f"{step}-{stamp}-{os.getpid()}")
          os.replace(src, dst)
          logger.warning("Moved corrupt checkpoint step %d to %s.", step, dst)
    if jax.process_count() > 1:
      ocp.multihost.sync_global_processes("credit_checkpoint_quarantine")
    self._mngr.reload()

  # ------------------------------------------------------------------- misc

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _warn_partial_dirs(self) -> None:
    if not os.path.isdir(self.directory):
      return
    for name in sorted(os.listdir(self.directory)):
      if _TMP_MARKER in name and name not in self._warned:
        self._warned.add(name)
        logger.warning(
            "Ignoring partial checkpoint %s in %s (a save that did not finish, "
            "e.g. the process was killed).", name, self.directory)

  def close(self) -> None:
    """Waits for pending saves and releases orbax resources."""
    self._finish_pending()
    self._mngr.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
