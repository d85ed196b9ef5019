"""GDPO (credit/advantages/outcome/gdpo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.outcome import gdpo_advantages
from tests.advantages.outcome._harness import (Case, N, ONE_GROUP, bt, fixed_batch, grpo_rows,
                                               reference_test, row0, valid_groups, whiten_np)


def ref_gdpo(b, weights=None, batch_norm="token", eps=1e-6, singleton="zero"):
  comps = b["reward_components"].astype(np.float64)
  w = np.ones(comps.shape[1]) if weights is None else np.asarray(weights, np.float64)
  s = sum(w[k] * grpo_rows(b, comps[:, k], "group", eps, singleton)
          for k in range(comps.shape[1]))
  valid, _ = valid_groups(b)
  m = b["response_mask"] & valid[:, None]
  if batch_norm == "token":
    return (whiten_np(s[:, None] * np.ones((1, m.shape[1])), m),)
  if batch_norm == "sequence" and valid.any():
    sv = s[valid]
    sd = sv.std(ddof=1) if sv.size > 1 else 0.0
    s = np.where(valid, (s - sv.mean()) / (sd + eps), 0.0)
  return (bt(s, b),)


GDPO = ("reward_components", "group_id", "response_mask")
CASES = [
    Case("gdpo", "gdpo", GDPO, ref_gdpo),
    Case("gdpo_seq", "gdpo", GDPO, ref_gdpo,
         (("batch_norm", "sequence"), ("weights", (0.3, 0.7)))),
    Case("gdpo_none_raw", "gdpo", GDPO, ref_gdpo,
         (("batch_norm", "none"), ("singleton", "raw"))),
]


test_matches_numpy_reference = reference_test(CASES)


def test_hand_example():
  # z-scores [.866, −.866, −.866, .866] + [.866, .866, −.866, −.866] = s, then whitened over
  # the 12 valid tokens (3 per row): var = 3·Σs²/(12 − 1).
  comps = np.array([[1., 1], [0, 1], [0, 0], [1, 0]], np.float32)
  a = row0(gdpo_advantages(reward_components=comps, **ONE_GROUP))
  s = np.array([0.866024 * 2, 0, -0.866024 * 2, 0])
  np.testing.assert_allclose(a, s / np.sqrt(3 * np.sum(s**2) / 11 + 1e-8), atol=1e-5)


def test_bad_batch_norm_raises():
  b = fixed_batch()
  with pytest.raises(ValueError, match="batch_norm 'batch'"):
    gdpo_advantages(reward_components=b["reward_components"], group_id=b["group_id"],
                    response_mask=b["response_mask"], num_groups=N, batch_norm="batch")
