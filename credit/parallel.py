"""Meshes, batch shardings and multi-host helpers (JAX's own runtime, nothing home-made).

The same code runs on one CPU, on 8 fake CPU devices
(`--xla_force_host_platform_device_count=8`) and on a pod: a `jax.sharding.Mesh`
with axes such as ('data', 'fsdp', 'tensor'); parameters take their shardings
from logical-axis rules (`credit.models.sharding`); batches are split by rows
over the data-parallel axes.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

# Axes that split the batch (rows); a mesh may have any subset of them.
BATCH_AXES = ("data", "fsdp")
KNOWN_AXES = ("data", "fsdp", "tensor")


def parse_mesh_spec(spec: str | Mapping[str, int]) -> dict[str, int]:
  """'data=2,fsdp=4' -> {'data': 2, 'fsdp': 4}; one size may be -1 (the rest)."""
  if isinstance(spec, Mapping):
    return dict(spec)
  out: dict[str, int] = {}
  for part in spec.replace(" ", "").split(","):
    if not part:
      continue
    if "=" not in part:
      raise ValueError(f"mesh spec {spec!r}: expected axis=size pairs like 'data=2,fsdp=4'")
    name, size = part.split("=", 1)
    if name not in KNOWN_AXES:
      raise ValueError(f"mesh spec {spec!r}: unknown axis {name!r}; known axes: {KNOWN_AXES}")
    if name in out:
      raise ValueError(f"mesh spec {spec!r}: axis {name!r} given twice")
    try:
      out[name] = int(size)
    except ValueError:
      raise ValueError(f"mesh spec {spec!r}: size of {name!r} must be an int, got {size!r}") from None
  if not out:
    out = {"data": -1}
  return out


def make_mesh(spec: str | Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over `devices` (default: all) with Auto axis types (classic propagation)."""
  sizes = parse_mesh_spec(spec)
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1:
    raise ValueError(f"mesh spec {sizes}: at most one axis may be -1")
  known = math.prod(v for v in sizes.values() if v != -1)
  if free:
    if n % known:
      raise ValueError(f"mesh spec {sizes}: {n} devices are not divisible by {known}")
    sizes[free[0]] = n // known
  if not free and math.prod(sizes.values()) < n:
    devices = devices[:math.prod(sizes.values())]  # a sub-mesh, e.g. data=1 for a baseline
    n = len(devices)
  if math.prod(sizes.values()) != n:
    raise ValueError(f"mesh spec {sizes} has {math.prod(sizes.values())} devices; "
                     f"{n} are available (use -1 for one axis to take the rest)")
  names = tuple(sizes)
  arr = np.asarray(devices, dtype=object).reshape(tuple(sizes.values()))
  return Mesh(arr, names, axis_types=(AxisType.Auto,) * len(names))


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
  """Rows split over the mesh's batch axes, other dimensions replicated."""
  axes = batch_axes(mesh)
  spec = P(axes if axes else None, *([None] * (ndim - 1)))
  return NamedSharding(mesh, spec)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh) -> int:
  """Row counts must be multiples of this for an even batch split."""
  return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def shard_batch(tree: Any, mesh: Mesh) -> Any:
  """Places host arrays (identical on every process) as row-sharded global arrays.

  Works single- and multi-process: each process supplies only the shards its
  devices hold, cut from its full host copy.
  """

  def place(x):
    x = np.asarray(x)
    sharding = batch_sharding(mesh, x.ndim) if x.ndim else replicated(mesh)
    if jax.process_count() == 1:
      return jax.device_put(x, sharding)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  return jax.tree.map(place, tree)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Host arrays (identical on every process) as fully replicated global arrays."""

  def place(x):
    x = np.asarray(x)
    if jax.process_count() == 1:
      return jax.device_put(x, replicated(mesh))
    return jax.make_array_from_callback(x.shape, replicated(mesh), lambda idx: x[idx])

  return jax.tree.map(place, tree)


def to_host(tree: Any) -> Any:
  """Global arrays -> full numpy arrays on every process."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  from jax.experimental import multihost_utils
  return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)


def initialize_distributed(coordinator_address: str, num_processes: int, process_id: int,
                           local_device_count: int | None = None) -> None:
  """`jax.distributed.initialize` for multi-host (or several CPU processes on one machine)."""
  if local_device_count is not None:
    jax.config.update("jax_num_cpu_devices", local_device_count)
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
