"""The rollout array contract (DESIGN.md) and eager input validation.

`Rollout` is a pytree holding one batch of B sequences of length T. Every field
but `tokens`/`response_mask` is optional (None when absent). Estimators never
take a `Rollout`: they take its fields as keyword arguments, so the runner can
pass exactly the fields a registry entry asks for (`rollout.fields(spec.needs)`).

`validate_*` helpers run eagerly, on concrete arrays, *before* tracing: they turn
bad input into errors that name the argument, instead of silent NaNs inside jit.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

import jax
import numpy as np
from flax import struct

# Field name -> (shape letters, dtype kind). Letters: B batch, T tokens, K turns/steps.
# dtype kinds: "i" integer, "b" bool (or 0/1 numeric mask), "f" floating.
CONTRACT: dict[str, tuple[str, str]] = {
    "tokens": ("BT", "i"),
    "response_mask": ("BT", "b"),
    "obs_mask": ("BT", "b"),
    "turn_id": ("BT", "i"),
    "group_id": ("B", "i"),
    "reward": ("B", "f"),
    "step_reward": ("BK", "f"),
    "step_mask": ("BK", "b"),
    "logprob": ("BT", "f"),
    "logprob_old": ("BT", "f"),
    "logprob_ref": ("BT", "f"),
    "logprob_teacher": ("BT", "f"),
    "logprob_sampler": ("BT", "f"),
    "entropy": ("BT", "f"),
    "values": ("BT", "f"),
    "values_old": ("BT", "f"),
    "advantages": ("BT", "f"),
    "returns": ("BT", "f"),
    "token_reward": ("BT", "f"),
}

# Fields whose values must be finite where they are used.
_FINITE = {"reward", "step_reward", "logprob", "logprob_old", "logprob_ref",
           "logprob_teacher", "logprob_sampler", "entropy", "values", "values_old",
           "advantages", "returns", "token_reward"}


@struct.dataclass
class Rollout:
  """One batch of rollouts, right-padded to T (see DESIGN.md, "The rollout contract").

  Attributes follow `CONTRACT`; absent fields are None. `extras` carries
  estimator-specific arrays (e.g. `sub_rewards`, `prompt_id`) by name.
  """
  tokens: jax.Array
  response_mask: jax.Array
  group_id: jax.Array | None = None
  reward: jax.Array | None = None
  obs_mask: jax.Array | None = None
  turn_id: jax.Array | None = None
  step_reward: jax.Array | None = None
  step_mask: jax.Array | None = None
  logprob: jax.Array | None = None
  logprob_old: jax.Array | None = None
  logprob_ref: jax.Array | None = None
  logprob_teacher: jax.Array | None = None
  logprob_sampler: jax.Array | None = None
  entropy: jax.Array | None = None
  values: jax.Array | None = None
  values_old: jax.Array | None = None
  advantages: jax.Array | None = None
  returns: jax.Array | None = None
  token_reward: jax.Array | None = None
  extras: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def batch_size(self) -> int:
    return self.tokens.shape[0]

  @property
  def seq_len(self) -> int:
    return self.tokens.shape[1]

  def get(self, name: str) -> Any:
    if hasattr(self, name) and name != "extras":
      return getattr(self, name)
    return self.extras.get(name)

  def fields(self, names: Iterable[str]) -> dict[str, Any]:
    """The named fields as a kwargs dict; raises if one is missing."""
    out = {}
    missing = []
    for n in names:
      v = self.get(n)
      if v is None:
        missing.append(n)
      out[n] = v
    if missing:
      raise ValueError(f"Rollout lacks field(s) {sorted(missing)} (present: "
                       f"{sorted(self.present())})")
    return out

  def present(self) -> list[str]:
    names = [f.name for f in dataclasses.fields(self) if f.name != "extras"
             and getattr(self, f.name) is not None]
    return names + list(self.extras)


class ContractError(ValueError):
  """Raised eagerly when an input violates the rollout contract."""


def _kind_ok(arr: np.ndarray, kind: str) -> bool:
  k = arr.dtype.kind
  if kind == "i":
    return k in "iu"
  if kind == "b":
    return k in "biuf"  # bool preferred; 0/1 numeric masks are accepted (checked below)
  if kind == "f":
    return k == "f"
  return True


def validate_fields(fields: Mapping[str, Any], *, num_groups: int | None = None,
                    where: str = "input", require_nonempty_mask: bool = True,
                    dims: Mapping[str, int] | None = None) -> dict[str, int]:
  """Checks contract fields eagerly; returns the resolved dimensions {B, T, K}.

  Checks: rank and shape agreement across fields (B, T, K), dtype kinds, 0/1
  masks, finite floats (only where `response_mask` selects, for [B,T] fields),
  group ids in [0, num_groups), and that `response_mask` selects at least one
  token. Unknown names are ignored (estimator-specific extras are checked by
  their estimator's own validator).

  Raises:
    ContractError naming the argument, the expected and the actual shape/dtype.
  """
  d: dict[str, int] = dict(dims or {})
  arrays = {}
  for name, val in fields.items():
    if val is None or name not in CONTRACT:
      continue
    try:
      arr = np.asarray(val)
    except Exception as e:  # tracers cannot be validated eagerly
      raise ContractError(f"{where}: `{name}` must be a concrete array to validate "
                          f"(call validate_* outside jit): {e}") from None
    letters, kind = CONTRACT[name]
    if arr.ndim != len(letters):
      raise ContractError(
          f"{where}: `{name}` must have shape [{','.join(letters)}] (rank {len(letters)}), "
          f"got shape {arr.shape}")
    for letter, size in zip(letters, arr.shape):
      if letter in d and d[letter] != size:
        raise ContractError(
            f"{where}: `{name}` has shape {arr.shape}; expected [{','.join(letters)}] with "
            f"{letter}={d[letter]} (from the other fields)")
      d.setdefault(letter, size)
    if not _kind_ok(arr, kind):
      want = {"i": "an integer dtype (int32)", "b": "bool", "f": "a float dtype (float32)"}[kind]
      raise ContractError(f"{where}: `{name}` must have {want}, got {arr.dtype}")
    if kind == "b" and arr.dtype.kind != "b":
      if not np.all((arr == 0) | (arr == 1)):
        raise ContractError(f"{where}: mask `{name}` must be bool or contain only 0/1")
    arrays[name] = arr

  mask = arrays.get("response_mask")
  if mask is not None:
    mask_b = mask.astype(bool)
    if require_nonempty_mask and not mask_b.any():
      raise ContractError(f"{where}: `response_mask` selects no token; nothing to train on")
  for name, arr in arrays.items():
    if name not in _FINITE:
      continue
    letters = CONTRACT[name][0]
    sel = arr
    if letters == "BT" and mask is not None:
      sel = arr[mask.astype(bool)]
    elif name == "step_reward" and "step_mask" in arrays:
      sel = arr[arrays["step_mask"].astype(bool)]
    bad = ~np.isfinite(sel)
    if bad.any():
      kind = "NaN" if np.isnan(sel).any() else "inf"
      raise ContractError(f"{where}: `{name}` contains {kind} values "
                          f"({int(bad.sum())} of {sel.size} checked entries)")
  gid = arrays.get("group_id")
  if gid is not None and num_groups is not None:
    if gid.size and (gid.min() < 0 or gid.max() >= num_groups):
      raise ContractError(f"{where}: `group_id` must lie in [0, num_groups={num_groups}), "
                          f"got range [{gid.min()}, {gid.max()}]")
  return d


def validate_rollout(rollout: Rollout, *, num_groups: int | None = None) -> dict[str, int]:
  """`validate_fields` over every present field of a `Rollout`."""
  fields = {n: rollout.get(n) for n in rollout.present() if n in CONTRACT}
  return validate_fields(fields, num_groups=num_groups, where="Rollout")


def contiguous_group_size(group_id: Any) -> int | None:
  """G when `group_id` is [0]*G + [1]*G + ... (the [N,G] fast path), else None."""
  gid = np.asarray(group_id)
  if gid.ndim != 1 or gid.size == 0:
    return None
  n = int(gid.max()) + 1
  if gid.size % n:
    return None
  G = gid.size // n
  return G if np.array_equal(gid, np.repeat(np.arange(n), G)) else None
