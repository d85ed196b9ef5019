"""Logical axis names -> mesh axes, in the style of maxtext `logical_axis_rules`.

Every model parameter names its axes logically (``("embed", "q_heads", "head_dim")``; see
``decoder.py``). A rules table maps each logical name to a mesh axis, a tuple of mesh axes, or None
(replicated). Resolution for one array (``logical_to_mesh_axes``), per dimension, in order:
  1. the first rule whose name matches gives the candidate mesh axes;
  2. mesh axes the mesh lacks, or that an earlier dimension of the same array already uses, are
     dropped (a mesh axis may shard one dimension only);
  3. if the shape is known, trailing mesh axes are dropped until the dimension is divisible by the
     product of their sizes (e.g. 2 kv heads on a tensor axis of 4 stay replicated).
So one table serves a single CPU, 8 fake devices and a pod.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# (logical name, mesh axes). Batch over data x fsdp; weights' model dim over fsdp (ZeRO-3 style);
# heads, mlp and vocab over tensor (Megatron style).
DEFAULT_RULES: tuple = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("layers", None),
    ("cache_seq", None),
    ("lora_rank", None),
)

CACHE_K_AXES = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
CACHE_V_AXES = ("layers", "batch", "kv_heads", "head_dim", "cache_seq")


def _as_tuple(axes) -> tuple:
  if axes is None:
    return ()
  if isinstance(axes, str):
    return (axes,)
  return tuple(axes)


def logical_to_mesh_axes(logical_axes: Sequence[str | None], mesh: Mesh,
                         rules: Sequence[tuple] = DEFAULT_RULES,
                         shape: Sequence[int] | None = None) -> PartitionSpec:
  """PartitionSpec for one array whose dimensions carry `logical_axes` (see module docstring)."""
  table: dict[str, Any] = {}
  for name, axes in rules:
    table.setdefault(name, axes)
  used: set = set()
  spec = []
  for d, name in enumerate(logical_axes):
    cand = [a for a in _as_tuple(table.get(name) if name is not None else None)
            if a in mesh.shape and a not in used]
    if shape is not None:
      while cand:
        size = 1
        for a in cand:
          size *= mesh.shape[a]
        if shape[d] % size == 0:
          break
        cand.pop()
    used.update(cand)
    spec.append(None if not cand else (cand[0] if len(cand) == 1 else tuple(cand)))
  return PartitionSpec(*spec)


def logical_sharding(mesh: Mesh, logical_axes: Sequence[str | None],
                     rules: Sequence[tuple] = DEFAULT_RULES,
                     shape: Sequence[int] | None = None) -> NamedSharding:
  """NamedSharding for one array with the given logical axes (e.g. ``("batch", None)``)."""
  return NamedSharding(mesh, logical_to_mesh_axes(logical_axes, mesh, rules, shape))


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def _var_sharding(v: nnx.Variable, mesh: Mesh, rules) -> NamedSharding:
  axes = v.get_metadata().get("out_sharding") or ()
  shape = v.shape
  if len(axes) != len(shape):
    axes = (None,) * len(shape)
  return logical_sharding(mesh, axes, rules, shape)


def logical_to_mesh_sharding(tree, mesh: Mesh, rules: Sequence[tuple] = DEFAULT_RULES):
  """Map a model, or an nnx.State of Variables, to the same State holding NamedShardings.

  The result has the pytree structure of ``nnx.state(model)``, so it can be given to
  ``jax.device_put(state, shardings)`` or as jit ``in_shardings`` / ``out_shardings``.
  Variables without logical names are replicated.
  """
  state = nnx.state(tree) if isinstance(tree, nnx.Module) else tree
  return jax.tree.map(lambda v: v.replace(_var_sharding(v, mesh, rules)), state, is_leaf=_is_var)


def shard_model(model: nnx.Module, mesh: Mesh, rules: Sequence[tuple] = DEFAULT_RULES):
  """Place every variable of `model` on `mesh` by its logical axes, in place; returns the model."""
  state = nnx.state(model)
  placed = jax.tree.map(
      lambda v: v.replace(jax.device_put(v[...], _var_sharding(v, mesh, rules))), state,
      is_leaf=_is_var)
  nnx.update(model, placed)
  return model


def cache_sharding(cache, mesh: Mesh, rules: Sequence[tuple] = DEFAULT_RULES):
  """A KVCache of NamedShardings: k over (layers, batch, kv_heads, cache_seq, head_dim), v over
  (layers, batch, kv_heads, head_dim, cache_seq)."""
  return type(cache)(k=logical_sharding(mesh, CACHE_K_AXES, rules, cache.k.shape),
                     v=logical_sharding(mesh, CACHE_V_AXES, rules, cache.v.shape),
                     valid=logical_sharding(mesh, ("batch", "cache_seq"), rules, cache.valid.shape),
                     index=NamedSharding(mesh, PartitionSpec()))
