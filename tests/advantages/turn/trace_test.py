"""TRACE (credit/advantages/turn/trace.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import trace
from tests.advantages.turn._ref import pooled_keys, returns, scatter, zscore_cells
from tests.advantages.turn.igpo_test import batch, np_layout, np_prev
from tests.contract_fields import N


def ref_trace(b, gamma=1.0, outcome_coef=1.0, normalize=True):
  row, valid, last = np_layout(b)
  g = np.maximum(np.where(valid, b["gold_logprob_turns"], 0.0), -50.0).astype(np.float64)
  g0 = np.maximum(b["gold_logprob_prompt"].astype(np.float64), -50.0)
  v = np.where(valid, g - g0[:, None], 0.0)
  r = np.where(valid, gamma * v - np_prev(v, valid, np.zeros(len(g0))), 0.0)
  r = r + np.where(last, outcome_coef * b["reward"][:, None], 0.0)
  if normalize:
    r = zscore_cells(r, valid, pooled_keys(b["group_id"], valid.shape[1]), ddof=0,
                     var_eps=1e-8)
  return scatter(returns(r, valid, gamma), b["turn_id"], b["response_mask"])


def _call(b, **kw):
  spec = registry.get_estimator("trace")
  return np.asarray(trace.trace_advantages(**{n: b[n] for n in spec.needs}, num_groups=N, **kw))


def test_spec_example_telescopes():
  # g = [−3, −2, −2.5, −0.5] → V = [0, 1, 0.5, 2.5], r = [1, −0.5, 2], Σr = V₃ = 2.5.
  tid = np.array([[0, 0, 1, 2]], np.int32)
  a = trace.trace_advantages(
      reward=np.array([1.0]), gold_logprob_turns=np.array([[-2.0, -2.5, -0.5]]),
      gold_logprob_prompt=np.array([-3.0]), step_mask=np.ones((1, 3), bool), turn_id=tid,
      group_id=np.zeros(1, np.int32), response_mask=tid >= 0, num_groups=1, normalize=False,
      outcome_coef=0.5)
  np.testing.assert_allclose(np.asarray(a)[0], [3.0, 3.0, 2.0, 2.5], atol=1e-5)


def test_floor_keeps_minus_inf_finite():
  tid = np.array([[0, 1]], np.int32)
  a = trace.trace_advantages(
      reward=np.array([0.0]), gold_logprob_turns=np.array([[-np.inf, -1.0]]),
      gold_logprob_prompt=np.array([-2.0]), step_mask=np.ones((1, 2), bool), turn_id=tid,
      group_id=np.zeros(1, np.int32), response_mask=tid >= 0, num_groups=1, normalize=False)
  np.testing.assert_allclose(np.asarray(a)[0], [1.0, 49.0], atol=1e-4)


@pytest.mark.parametrize("seed", (0, 3))
@pytest.mark.parametrize("kw", [{}, {"gamma": 0.9, "outcome_coef": 2.0}])
def test_matches_numpy_reference(seed, kw):
  b = batch(seed)
  np.testing.assert_allclose(_call(b, **kw), ref_trace(b, **kw), rtol=1e-4, atol=1e-5)
