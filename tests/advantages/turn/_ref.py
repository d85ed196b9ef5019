"""Float64 numpy building blocks for the turn-estimator tests (loops over the formulas).

Per-turn arrays are [B,K] with a validity mask `valid` (the contract's `step_mask`); turn k's
policy tokens are those with `turn_id == k` inside `response_mask`.
"""
from __future__ import annotations

import numpy as np


def zscore_cells(x, valid, keys, *, ddof=0, eps=1e-6, var_eps=0.0, min_count=2, small="zero"):
  """z-score of x[b,k] over the valid cells sharing keys[b,k] (any hashable; None = dropped)."""
  x = np.asarray(x, np.float64)
  out = np.zeros_like(x)
  pools: dict = {}
  for b in range(x.shape[0]):
    for k in range(x.shape[1]):
      if valid[b, k] and keys[b][k] is not None:
        pools.setdefault(keys[b][k], []).append((b, k))
  for cells in pools.values():
    v = np.array([x[c] for c in cells])
    n = len(v)
    mu = v.mean()
    if n < min_count:
      for c, vi in zip(cells, v):
        out[c] = {"zero": 0.0, "raw": vi, "centred": vi - mu}[small]
      continue
    var = ((v - mu) ** 2).sum() / max(n - ddof, 1) if n > ddof else 0.0
    sd = np.sqrt(var + var_eps)
    for c, vi in zip(cells, v):
      out[c] = (vi - mu) / (sd + eps)
  return out


def pooled_keys(group_id, K):
  return [[int(g)] * K for g in group_id]


def index_keys(group_id, K):
  return [[(int(g), k) for k in range(K)] for g in group_id]


def returns(x, valid, gamma=1.0, sqrt_n=False):
  """A_k = x_k + γ A_{next valid}; optionally / sqrt(#valid turns from k on)."""
  x = np.asarray(x, np.float64)
  out = np.zeros_like(x)
  for b in range(x.shape[0]):
    run, n = 0.0, 0
    for k in reversed(range(x.shape[1])):
      if valid[b, k]:
        run = x[b, k] + gamma * run
        n += 1
        out[b, k] = run / np.sqrt(n) if sqrt_n else run
  return out


def scatter(a_BK, turn_id, response_mask):
  """Token t of row b gets a_BK[b, turn_id[b,t]] on policy tokens of a turn, else 0."""
  out = np.zeros(turn_id.shape)
  K = a_BK.shape[1]
  for b in range(turn_id.shape[0]):
    for t in range(turn_id.shape[1]):
      k = turn_id[b, t]
      if response_mask[b, t] and 0 <= k < K:
        out[b, t] = a_BK[b, k]
  return out
