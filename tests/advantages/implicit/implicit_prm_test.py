"""Tests for the implicit-PRM step rewards and scores (credit/advantages/implicit/implicit_prm.py).

As the authors' evaluation code (coefficient 0.001, aggregations min and sum). Float64 loop
reference from the formulas.
"""
from __future__ import annotations

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit.advantages.implicit import implicit_prm as ip

B, T, K = 6, 8, 3


def ref_steps(mask, lp, ref, sid, k, coef):
  r = np.zeros((mask.shape[0], k))
  ok = np.zeros((mask.shape[0], k), bool)
  for b in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      if mask[b, t] and 0 <= sid[b, t] < k:
        r[b, sid[b, t]] += coef * (lp[b, t] - (0.0 if ref is None else ref[b, t]))
        ok[b, sid[b, t]] = True
  q = np.zeros_like(r)
  for b in range(r.shape[0]):
    run = 0.0
    for j in range(k):
      run += r[b, j]
      q[b, j] = run if ok[b, j] else 0.0
  return r, q, ok


def ref_score(r, q, ok, aggregation, value):
  x = r if value == "step" else q
  out = []
  for b in range(x.shape[0]):
    vals = [x[b, j] for j in range(x.shape[1]) if ok[b, j]]
    out.append(0.0 if not vals else (min(vals) if aggregation == "min" else sum(vals)))
  return np.array(out)


@st.composite
def batches(draw):
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  lengths = rng.integers(0, T + 1, B)
  mask = np.arange(T)[None, :] < lengths[:, None]
  sid = np.sort(rng.integers(-1, K + 1, (B, T)), axis=1).astype(np.int32)
  sid = np.where(mask, sid, -1).astype(np.int32)
  lp = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  ref = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  return dict(response_mask=mask, step_id=sid, logprob_prm=lp, logprob_ref=ref)


def test_worked_example():
  # Two steps: tokens {0,1} and {2}; log-ratios [0.2, −0.1, 0.3]; c = 0.05 (β of PRIME).
  kw = dict(logprob_prm=np.array([[0.2, -0.1, 0.3]], np.float32),
            logprob_ref=np.zeros((1, 3), np.float32), response_mask=np.ones((1, 3), bool),
            step_id=np.array([[0, 0, 1]], np.int32), num_steps=3, coef=0.05)
  out = ip.implicit_prm_step_rewards(**kw)
  np.testing.assert_allclose(np.asarray(out.step_reward), [[0.005, 0.015, 0.0]], atol=1e-7)
  np.testing.assert_allclose(np.asarray(out.step_value), [[0.005, 0.02, 0.0]], atol=1e-7)
  np.testing.assert_array_equal(np.asarray(out.step_mask), [[True, True, False]])
  assert float(ip.implicit_prm_score(**kw)[0]) == pytest.approx(0.005)
  assert float(ip.implicit_prm_score(aggregation="sum", **kw)[0]) == pytest.approx(0.02)
  assert float(ip.implicit_prm_score(value="cumulative", aggregation="sum", **kw)[0]) == (
      pytest.approx(0.025))


@pytest.mark.parametrize("aggregation,value,with_ref", [
    ("min", "step", True), ("sum", "step", True), ("min", "cumulative", True),
    ("sum", "cumulative", False)])
@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches())
def test_matches_numpy_reference(aggregation, value, with_ref, b):
  b = dict(b, logprob_ref=b["logprob_ref"] if with_ref else None)
  r, q, ok = ref_steps(b["response_mask"], b["logprob_prm"], b["logprob_ref"], b["step_id"],
                       K, 0.001)
  out = jax.jit(ip.implicit_prm_step_rewards, static_argnames="num_steps")(num_steps=K, **b)
  np.testing.assert_allclose(np.asarray(out.step_reward), r, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(np.asarray(out.step_value), q, rtol=1e-5, atol=1e-8)
  np.testing.assert_array_equal(np.asarray(out.step_mask), ok)
  score = ip.implicit_prm_score(num_steps=K, aggregation=aggregation, value=value, **b)
  np.testing.assert_allclose(np.asarray(score), ref_score(r, q, ok, aggregation, value),
                             rtol=1e-5, atol=1e-8)
  # The step rewards sum to c·(sequence log-ratio over the tokens inside steps).
  inside = b["response_mask"] & (b["step_id"] >= 0) & (b["step_id"] < K)
  lr = b["logprob_prm"] - (0 if b["logprob_ref"] is None else b["logprob_ref"])
  np.testing.assert_allclose(np.asarray(out.step_reward).sum(1),
                             0.001 * np.where(inside, lr, 0).sum(1), rtol=1e-4, atol=1e-7)


def test_nan_outside_mask_and_bad_args():
  mask = np.array([[1, 1, 0]], bool)
  lp = np.array([[0.1, 0.2, np.nan]], np.float32)
  out = ip.implicit_prm_step_rewards(logprob_prm=lp, logprob_ref=None, response_mask=mask,
                                     step_id=np.array([[0, 1, 1]], np.int32), num_steps=2)
  assert np.all(np.isfinite(np.asarray(out.step_reward)))
  with pytest.raises(ValueError, match="num_steps"):
    ip.implicit_prm_step_rewards(logprob_prm=lp, logprob_ref=None, response_mask=mask,
                                 step_id=np.zeros((1, 3), np.int32), num_steps=0)
  with pytest.raises(ValueError, match="aggregation"):
    ip.implicit_prm_score(logprob_prm=lp, logprob_ref=None, response_mask=mask,
                          step_id=np.zeros((1, 3), np.int32), num_steps=2, aggregation="mean")
  with pytest.raises(AssertionError):
    ip.implicit_prm_step_rewards(logprob_prm=lp, logprob_ref=None, response_mask=mask,
                                 step_id=np.zeros((1, 3), np.float32), num_steps=2)
