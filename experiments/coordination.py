"""Coordination of separate processes through JAX's multi-controller coordination service.

The asynchronous runner (`experiments/async_rl.py`) runs a trainer and rollout workers as
separate processes. They talk through the key-value store of the coordination service that
`jax.distributed.initialize` uses for multi-host JAX (the same gRPC service, its heartbeats
and its failure propagation), started here on its own so that every process keeps a
single-process JAX: each jits on its own devices, and nothing in the synchronous code paths
(`parallel.to_host`, orbax, `process_index() == 0`) turns into a collective across roles.

Process 0 hosts the service; every process (0 included) is a client. A process that dies is
noticed through the heartbeats, and the service stops the others (they abort), which is
what a kill test relies on: the whole system restarts from the trainer's checkpoint.

Tested with jax / jaxlib 0.10.2: `jax.distributed` exposes this store only through
`jax._src` (`jaxlib._jax.get_distributed_runtime_service` / `_client`); the import is kept
to this module so a JAX upgrade has one place to look.
"""
from __future__ import annotations

import json
import socket
import time
from typing import Any


class CoordinationError(RuntimeError):
  """A coordination call failed or timed out (another process died, or never came)."""


def free_port() -> int:
  """An unused local TCP port (for a coordinator on one machine)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


class Coordinator:
  """A client of the coordination service (process 0 also hosts it).

  Args:
    address: "host:port" of process 0.
    num_processes: processes in the system (trainer + workers).
    process_id: this process, 0 .. num_processes - 1.
    heartbeat_s: a process silent this long is declared dead; the others are stopped.
    connect_timeout_s: how long `connect` waits for every process to join.
  """

  def __init__(self, address: str, num_processes: int, process_id: int, *,
               heartbeat_s: int = 20, connect_timeout_s: int = 300):
    from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
    if not 0 <= process_id < num_processes:
      raise ValueError(f"Need 0 <= process_id < num_processes, got {process_id}, "
                       f"{num_processes}")
    self.process_id, self.num_processes = process_id, num_processes
    self._service = None
    if process_id == 0:
      port = address.rsplit(":", 1)[1]
      self._service = _jax.get_distributed_runtime_service(
          f"[::]:{port}", num_processes, heartbeat_timeout=heartbeat_s, shutdown_timeout=30)
    self._client = _jax.get_distributed_runtime_client(
        address, process_id, init_timeout=connect_timeout_s, heartbeat_timeout=heartbeat_s,
        shutdown_timeout=30, shutdown_on_destruction=False)
    self._client.connect()

  # --- the store --------------------------------------------------------------------
  def set(self, key: str, value: bytes | str, overwrite: bool = True) -> None:
    data = value.encode() if isinstance(value, str) else value
    self._client.key_value_set_bytes(key, data, allow_overwrite=overwrite)

  def get(self, key: str, timeout_s: float) -> bytes:
    """The value of `key`, waiting up to `timeout_s` for it to be set."""
    try:
      return self._client.blocking_key_value_get_bytes(key, int(timeout_s * 1000))
    except Exception as e:  # jax.errors.JaxRuntimeError (DEADLINE_EXCEEDED, UNAVAILABLE)
      raise CoordinationError(f"waiting for {key!r}: {e}") from None

  def try_get(self, key: str) -> bytes | None:
    """The value of `key`, or None when it is not set."""
    try:
      return self._client.key_value_try_get_bytes(key)
    except Exception as e:  # NOT_FOUND is the normal "not yet"
      if "NOT_FOUND" in str(e):
        return None
      raise CoordinationError(f"reading {key!r}: {e}") from None

  def keys(self, prefix: str) -> list[str]:
    """The keys under directory `prefix` ("a/b/" lists "a/b/..."), values not fetched twice."""
    return [k for k, _ in self._client.key_value_dir_get_bytes(prefix)]

  def delete(self, key: str) -> None:
    self._client.key_value_delete(key)

  def increment(self, key: str, by: int = 1) -> int:
    """Atomically adds `by` to the integer at `key` (0 when unset); returns the new value."""
    return int(self._client.key_value_increment(key, by))

  def set_json(self, key: str, value: Any) -> None:
    self.set(key, json.dumps(value))

  def get_json(self, key: str, timeout_s: float) -> Any:
    return json.loads(self.get(key, timeout_s))

  def try_get_json(self, key: str) -> Any:
    raw = self.try_get(key)
    return None if raw is None else json.loads(raw)

  def barrier(self, name: str, timeout_s: float) -> None:
    try:
      self._client.wait_at_barrier(name, int(timeout_s * 1000))
    except Exception as e:
      raise CoordinationError(f"barrier {name!r}: {e}") from None

  def wait_key(self, key: str, timeout_s: float, poll_s: float = 0.0) -> bytes:
    """The value of `key` once it is set, waiting up to `timeout_s` (CoordinationError after).

    poll_s = 0 (default): one blocking get; the service answers when the key is set, so
    the waiting process uses no CPU (the service offers no wait on a directory or on a
    change of value, hence the asynchronous runner's sequence-numbered notice keys).
    poll_s > 0: `try_get` every `poll_s` seconds instead (the earlier busy polling, kept to
    measure against; benchmarks/async_transfer.py).
    """
    if not poll_s:
      return self.get(key, timeout_s)
    t0 = time.perf_counter()
    while (raw := self.try_get(key)) is None:
      if time.perf_counter() - t0 > timeout_s:
        raise CoordinationError(f"waiting for {key!r}: timed out after {timeout_s:.0f}s")
      time.sleep(poll_s)
    return raw

  def close(self) -> None:
    """Leaves the service (process 0 last: it shuts the service down)."""
    try:
      self._client.shutdown()
    except Exception:  # pylint: disable=broad-except
      pass
    if self._service is not None:
      self._service.shutdown()
      self._service = None
