"""M2PO (credit/losses/policy/m2po.py): the worked example, the breakpoint search against the
code's loop, the budget it enforces, the unbounded case, and a zero budget.

Registry-wide properties and the numpy reference on random batches (tests/losses/helpers.py
`np_token_loss`) are in tests/registry_common_test.py and tests/losses/policy_test.py.
"""
import math

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from credit.losses.policy.m2po import m2_trust_bound
from tests.losses.helpers import make_batch, one_row, run

_bound = jax.jit(m2_trust_bound)


def _code_tau(harm, budget):
  """The released solver as a loop (`_solve_tau_from_sorted_delta2`): τ or None (no bound)."""
  n = len(harm)
  if not n or sum(harm) / n <= budget + 1e-12:
    return None
  v = sorted(harm)
  csum = np.cumsum(v)
  for k in range(n):
    if v[k] * (n - k - 1) + csum[k] >= budget * n - 1e-12:
      return 0.0 if k == 0 else math.sqrt(max(v[k - 1] - 1e-12, 0.0))


def test_worked_example():
  b = one_row([-0.5, -0.9, -1.3], [-1.0, -1.0, -1.0], 1.0)  # Δ = [−0.5, −0.1, 0.3]
  b["advantages"] = np.array([[1.0, 1.0, -1.0]], np.float32)
  loss, metrics, _ = run("m2po", b)
  np.testing.assert_allclose(loss, -0.435168, atol=1e-5)
  np.testing.assert_allclose(metrics["m2_tau"], 0.1, atol=1e-6)
  np.testing.assert_allclose(metrics["m2"], 0.35 / 3, atol=1e-6)
  np.testing.assert_allclose(metrics["m2_after"], 0.01, atol=1e-6)
  assert metrics["m2_bounded"] == 1.0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 4.0), min_size=0, max_size=24), st.integers(0, 8),
       st.floats(0.001, 0.5))
def test_bound_matches_the_code_and_fits_the_budget(harm, pad, budget):
  harm = [np.float32(h) ** 2 for h in harm]
  d2 = np.array(harm + [9.0] * pad, np.float32)   # the padding is not harmful
  h = np.arange(len(d2)) < len(harm)
  tau, m2, after = (float(x) for x in _bound(d2, h, np.float32(budget)))
  want = _code_tau([float(x) for x in harm], budget)
  if want is None:
    assert tau == 1e5 and after == m2
    return
  v = np.sort(np.array(harm, np.float64))
  if np.any(np.abs(np.diff(v)) < 1e-5) or abs(float(np.mean(v)) - budget) < 1e-4:
    return  # ties and budget edges are decided by float32 rounding
  np.testing.assert_allclose(tau, want, rtol=1e-4, atol=1e-5)
  capped = np.minimum(np.asarray(harm, np.float64), tau ** 2)
  assert capped.mean() <= budget + 1e-5               # the cap keeps M2 within the budget
  np.testing.assert_allclose(after, capped.mean(), rtol=1e-4, atol=1e-6)


def test_within_budget_is_the_unclipped_importance_weighted_gradient():
  b = make_batch(3, delta_scale=0.05)
  loss, metrics, g = run("m2po", b)
  m = b["response_mask"]
  r = np.exp(b["logprob"].astype(np.float64) - b["logprob_old"])
  want = np.sum(np.where(m, -b["advantages"] * r, 0.0)) / m.sum()
  assert metrics["m2_bounded"] == 0.0 and metrics["m2"] <= 0.04
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(g["logprob"], np.where(m, -b["advantages"] * r, 0.0) / m.sum(),
                             rtol=1e-4, atol=1e-7)


def test_zero_budget_bounds_every_harmful_ratio_at_one():
  b = make_batch(5, delta_scale=0.5)
  loss, metrics, g = run("m2po", b, hp={"m2_budget": 0.0})
  assert metrics["m2_tau"] == 0.0 and np.isfinite(loss)
  m = b["response_mask"]
  r = np.exp(b["logprob"].astype(np.float64) - b["logprob_old"])
  harmful = m & (((b["advantages"] > 0) & (r > 1)) | ((b["advantages"] < 0) & (r < 1)))
  assert harmful.any() and np.all(g["logprob"][harmful] == 0)  # clipped: no gradient
