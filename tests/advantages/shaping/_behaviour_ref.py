"""Float64 numpy references and shared property checks for the behaviour-diversity shaping
methods (satisdive, novelty_search, serene): descriptors, distances, novelty against an
archive, archive insertion, written as plain loops from the formulas in the docstrings.

The properties (masking equals slicing, padding invariance, permutation within a group,
finite values on degenerate groups, jit equals eager) run on hypothesis batches from the
outcome harness (`tests/advantages/outcome/_harness.py`), with a random state drawn here.
"""
from __future__ import annotations

import chex
import jax
import numpy as np

from tests.advantages.outcome._harness import G, N, T, batches, valid_groups

__all__ = ["descriptors", "novelty_ref", "insert_ref", "z_rows", "random_archive",
           "check_properties"]

P, A, D = 7, 32, 64


def descriptors(tokens, mask, dim=D):
  out = np.zeros((len(tokens), dim))
  for i in range(len(tokens)):
    ids = [int(t) % dim for t, m in zip(tokens[i], mask[i]) if m]
    for t in ids:
      out[i, t] += 1.0 / len(ids)
  return out


def z_rows(x, rows, scale=True, eps=1e-6):
  """Group z-score of x over `rows` ({} for a group of one)."""
  if len(rows) < 2:
    return {i: 0.0 for i in rows}
  v = np.array([x[i] for i in rows], np.float64)
  c = v - v.mean()
  if scale:
    c = c / (v.std(ddof=1) + eps)
  return dict(zip(rows, c))


def novelty_ref(b, archive, inserted, k=15):
  """Novelty [B] and the rows of each group (valid rows only)."""
  valid, groups = valid_groups(b)
  phi = descriptors(b["tokens"], b["response_mask"], archive.shape[2])
  nov = np.zeros(len(valid))
  for rows in groups:
    for i in rows:
      p = int(b["prompt_id"][i])
      ref = [np.linalg.norm(phi[i] - phi[j]) for j in rows if j != i]
      if 0 <= p < archive.shape[0]:
        ref += [np.linalg.norm(phi[i] - archive[p, s])
                for s in range(min(int(inserted[p]), archive.shape[1]))]
      ref = sorted(ref)[:k]
      nov[i] = np.mean(ref) if ref else 0.0
  return nov, groups, phi


def insert_ref(archive, inserted, phi, nov, groups, pid, add=1):
  """The archive after the `add` most novel rows of each group were written; ties in novelty
  go to the larger content key φ·w, w_d = cos(1.618034·d + 0.5), then to the earlier row."""
  archive, inserted = archive.copy(), inserted.copy()
  a = archive.shape[1]
  key = phi @ np.cos(np.arange(phi.shape[1]) * 1.618034 + 0.5)
  nov = np.asarray(nov, np.float32)   # ties as the float32 estimator sees them
  for rows in groups:
    p = int(pid[rows[0]])
    if not 0 <= p < archive.shape[0]:
      continue
    best = sorted(rows, key=lambda i: (-nov[i], -key[i], i))[:add]
    for r, i in enumerate(best):
      archive[p, (inserted[p] + r) % a] = phi[i]
    inserted[p] += len(best)
  return archive, inserted


def random_archive(seed, filled=True):
  rng = np.random.default_rng(seed)
  arch = np.zeros((P, A, D), np.float32)
  ins = rng.integers(0, 5, P).astype(np.int32) if filled else np.zeros(P, np.int32)
  for p in range(P):
    for s in range(min(ins[p], A)):
      ids = rng.integers(3, 50, rng.integers(1, T + 1))
      arch[p, s] = descriptors(ids[None], np.ones((1, len(ids)), bool))[0]
  return arch, ins


def _rows(x) -> bool:
  return np.ndim(x) >= 1 and np.shape(x)[0] == N * G


def check_properties(data, call, stateful_leaves: int = 0):
  """Masking equals slicing (state included), padding with garbage changes nothing,
  permutation within groups moves rows only, degenerate groups are finite and masked
  entries zero, jit equals eager. `call(b, jit)` returns the output leaves."""
  b = data.draw(batches(contiguous=False, holes=True))
  b = {k_: v for k_, v in b.items() if isinstance(v, np.ndarray)}   # no DCPO state
  b["prompt_id"] = ((b["group_id"] * 5 + 2) % P).astype(np.int32)
  out = call(b, True)
  for x in out:
    assert np.all(np.isfinite(x))
  mask = b["response_mask"]
  assert np.all(out[0][~mask] == 0.0)
  # Masked rows equal sliced rows; padded columns of garbage change nothing.
  drop = np.zeros(N * G, bool)
  drop[data.draw(st_rows())] = True
  masked = call(dict(b, response_mask=mask & ~drop[:, None]), True)
  assert np.all(masked[0][drop] == 0.0)
  cut = {}
  for k_, v in b.items():
    v = v[~drop] if _rows(v) else v
    if np.ndim(v) == 2 and v.shape[1] == T:
      fill = False if v.dtype == bool else (-1 if v.dtype.kind == "i" else np.nan)
      v = np.concatenate([v, np.full((v.shape[0], 2), fill, v.dtype)], 1)
    cut[k_] = v
  got = call(cut, True)
  for g_, w_ in zip(got, masked):
    w_ = w_[~drop] if _rows(w_) else w_
    if np.ndim(g_) == 2 and g_.shape[1] == T + 2:
      assert np.all(g_[:, T:] == 0.0)
      g_ = g_[:, :T]
    np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-5)
  # Permutation of the rows (segment path): rows move, state does not change.
  perm = np.random.default_rng(data.draw(st_seed())).permutation(N * G)
  pout = call({k_: v[perm] if _rows(v) else v for k_, v in b.items()}, True)
  for o, p_ in zip(out, pout):
    np.testing.assert_allclose(p_, o[perm] if _rows(o) else o, rtol=1e-5, atol=1e-5)
  # Jit equals eager.
  chex.assert_trees_all_close(jax.tree.map(np.asarray, call(b, False)), out, rtol=1e-5,
                              atol=1e-5)


def st_rows():
  from hypothesis import strategies as st
  return st.lists(st.integers(0, N * G - 1), max_size=4)


def st_seed():
  from hypothesis import strategies as st
  return st.integers(0, 2**31 - 1)
