"""GPG (credit/advantages/outcome/gpg.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.outcome import gpg_advantages
from tests.advantages.outcome._harness import (BASE, Case, N, bt, fixed_batch, reference_test, row0,
                                               valid_groups)


def ref_gpg(b, alpha="valid_fraction", scale=False, eps=1e-6, singleton="zero"):
  r = b["reward"].astype(np.float64)
  valid, groups = valid_groups(b)
  nv = valid.sum()
  if alpha == "valid_fraction":
    m = sum(len(rows) for rows in groups if np.all(r[rows] == r[rows][0]))
    a = nv / max(nv - m, 1)
  elif alpha == "nonzero_reward":
    a = nv / max((valid & (r != 0)).sum(), 1)
  else:
    a = 1.0
  out = np.zeros(len(r))
  for rows in groups:
    x = r[rows]
    if len(rows) == 1:
      out[rows] = a * x if singleton == "raw" else 0.0
      continue
    c = x - x.mean()
    if scale:
      c = c / (x.std(ddof=1) + eps)
    out[rows] = a * c
  return (bt(out, b),)


CASES = [
    Case("gpg", "gpg", BASE, ref_gpg),
    Case("gpg_verl", "gpg", BASE, ref_gpg,
         (("alpha", "nonzero_reward"), ("scale", True), ("singleton", "raw"))),
    Case("gpg_one", "gpg", BASE, ref_gpg, (("alpha", "one"),)),
]


test_matches_numpy_reference = reference_test(CASES)


def test_hand_example():
  # One informative and one all-equal group: B = 8, M = 4 -> α = 2.
  a = gpg_advantages(reward=np.array([1., 0, 0, 1, 1, 1, 1, 1], np.float32),
                     group_id=np.repeat(np.arange(2), 4).astype(np.int32),
                     response_mask=np.ones((8, 2), bool), num_groups=2)
  np.testing.assert_allclose(row0(a), [1., -1, -1, 1, 0, 0, 0, 0], atol=1e-6)


def test_bad_alpha_raises():
  b = fixed_batch()
  with pytest.raises(ValueError, match="alpha 'paper'"):
    gpg_advantages(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
                   num_groups=N, alpha="paper")
