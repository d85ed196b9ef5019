"""Float64 numpy pieces shared by the brief-A shaping tests (scrl, verpo_tests, c_grpo,
searchllm, atom_searcher). Batches, cases and the hypothesis runner come from the outcome
harness (tests/advantages/outcome/_harness.py)."""
from __future__ import annotations

import functools

import jax
import numpy as np

from tests.advantages.outcome._harness import N, bt, valid_groups

__all__ = ["z_items", "grpo_on", "one_group", "jcall"]


def z_items(values, gid, ok, eps=1e-6, singleton="zero", num_groups=N):
  """Group z-score of `values` [M] over the items with `ok` (unbiased σ, ε on σ); 0 elsewhere."""
  out = np.zeros(len(values))
  for g in range(num_groups):
    rows = np.nonzero(ok & (gid == g))[0]
    if rows.size == 0:
      continue
    x = np.asarray(values, np.float64)[rows]
    if rows.size == 1:
      out[rows] = x if singleton == "raw" else 0.0
      continue
    out[rows] = (x - x.mean()) / (x.std(ddof=1) + eps)
  return out


def grpo_on(b, R, eps=1e-6, singleton="zero"):
  """GRPO advantages [B,T] of per-row rewards R over the valid rows of `b`."""
  valid, _ = valid_groups(b)
  return bt(z_items(R, b["group_id"], valid, eps, singleton), b)


def one_group(rows: int, tokens: int = 3) -> dict:
  """Layout arguments for a worked example: one group of `rows` rows of `tokens` tokens."""
  return dict(group_id=np.zeros(rows, np.int32), response_mask=np.ones((rows, tokens), bool),
              num_groups=1)


@functools.lru_cache(maxsize=None)
def _jitted(fn, static: tuple):
  return jax.jit(lambda data: fn(**data, **dict(static)))


def jcall(fn, **kw):
  """fn(**kw) under jit (much cheaper than eager op-by-op dispatch): arrays are traced, the
  other arguments (strings, numbers, None, lists as tuples) static."""
  data = {k: v for k, v in kw.items() if isinstance(v, (np.ndarray, jax.Array))}
  static = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in kw.items() if k not in data))
  return _jitted(fn, static)(data)
