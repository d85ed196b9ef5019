"""Pass@k group advantages (credit/advantages/outcome/grpo_passk.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from credit.advantages.outcome import grpo_passk_advantages
from tests.advantages.outcome._harness import (BASE, Case, N, ONE_GROUP, bt, fixed_batch,
                                               reference_test, row0, valid_groups)


def _comb(n, k):
  if k == 0:
    return 1
  if n < 0 or k < 0 or k > n:
    return 0
  return math.comb(n, k)


def ref_grpo_passk(b, method="best_vs_second", k=4, scale=True, eps=1e-6):
  r = b["reward"].astype(np.float64)
  _, groups = valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    n = len(rows)
    if n < 2:
      continue
    x = r[rows]
    if method == "best_vs_second":
      top = np.nonzero(x == x.max())[0]
      if top.size == 1:
        gap = x.max() - x[x < x.max()].max()
        out[rows[top[0]]] = gap / (x.std(ddof=1) + eps) if scale else gap
    else:
      c = int((x > 0).sum())
      ke = min(k, n)
      rho = 1 - _comb(n - c, ke) / _comb(n, ke)
      sig = math.sqrt(max(rho * (1 - rho), 0.0))
      pos = (1 - rho) / (sig + eps)
      neg = (1 - rho - _comb(n - c - 1, ke - 1) / _comb(n - 1, ke - 1)) / (sig + eps)
      out[rows] = np.where(x > 0, pos, neg)
  return (bt(out, b),)


CASES = [
    Case("grpo_passk", "grpo_passk", BASE, ref_grpo_passk),
    Case("grpo_passk_noscale", "grpo_passk", BASE, ref_grpo_passk, (("scale", False),)),
    Case("grpo_passk_analytic", "grpo_passk", BASE, ref_grpo_passk,
         (("method", "analytic"), ("k", 2))),
    Case("grpo_passk_analytic_k_gt_n", "grpo_passk", BASE, ref_grpo_passk,
         (("method", "analytic"), ("k", 6))),
]


test_matches_numpy_reference = reference_test(CASES)


def test_hand_examples():
  # Best vs second: only the unique best row is credited, by r_max − r_second.
  r = np.array([1., 0, 0.5, 0], np.float32)
  std = np.std([1, 0, 0.5, 0], ddof=1)
  np.testing.assert_allclose(row0(grpo_passk_advantages(reward=r, **ONE_GROUP)),
                             [0.5 / (std + 1e-6), 0, 0, 0], rtol=1e-5)
  # A tie at the top credits nobody.
  tie = grpo_passk_advantages(reward=np.array([1., 1, 0, 0], np.float32), **ONE_GROUP)
  assert np.all(np.asarray(tie) == 0.0)
  # Analytic, n=4, c=2, k=2: ρ = 5/6, σ = √5/6 -> ±(1/6)/σ = ±0.447214.
  a = grpo_passk_advantages(reward=np.array([1., 0, 1, 0], np.float32), method="analytic",
                            k=2, **ONE_GROUP)
  np.testing.assert_allclose(row0(a), [0.447213, -0.447213, 0.447213, -0.447213], atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(method="topk"), r"method 'topk'"),
    (dict(k=0), r"k must be a Python int >= 1"),
])
def test_bad_static_args_raise(kwargs, match):
  b = fixed_batch()
  with pytest.raises(ValueError, match=match):
    grpo_passk_advantages(reward=b["reward"], group_id=b["group_id"],
                          response_mask=b["response_mask"], num_groups=N, **kwargs)
