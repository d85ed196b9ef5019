"""SearchLLM gated aggregation (credit/advantages/shaping/searchllm.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.shaping import searchllm_advantages
from tests.advantages.outcome._harness import Case, reference_test, row0
from tests.advantages.shaping._harness_a import grpo_on, jcall, one_group

FIELDS = ("reward_components", "group_id", "response_mask")


def shaped_reward(b, num_gates=1, thresholds=1.0, weights=None, r_fail=0.0, mode="hard"):
  c = b["reward_components"].astype(np.float64)
  gates, obj = c[:, :num_gates], c[:, num_gates:]
  w = np.ones(obj.shape[1]) if weights is None else np.asarray(weights, np.float64)
  w = w / w.sum()
  s = obj @ w
  if mode == "soft":
    return (gates.min(1) if num_gates else 1.0) * s
  ok = np.all(gates >= np.broadcast_to(thresholds, (num_gates,)), axis=1)
  return np.where(ok, s, r_fail)


def ref_searchllm(b, singleton="zero", **kw):
  return (grpo_on(b, shaped_reward(b, **kw), singleton=singleton),)


# The harness batches have R = 2 columns: [reward ∈ {0, ±1, 0.5, ...}, a 0/1 column].
CASES = [
    Case("searchllm", "searchllm", FIELDS, ref_searchllm, (("r_fail", -1.0),)),
    Case("searchllm_soft", "searchllm", FIELDS, ref_searchllm, (("mode", "soft"),)),
]

test_matches_numpy_reference = reference_test(CASES)


def test_worked_example():
  # Worked example: gates [[1,1],[1,0]] (τ=1), obj [[0.8,0.6],[0.9,0.9]], w=[0.5,0.5] -> R=[0.7, 0];
  # a two-row group gives ±0.707107.
  comps = np.array([[1, 1, 0.8, 0.6], [1, 0, 0.9, 0.9]], np.float32)
  a = row0(jcall(searchllm_advantages, reward_components=comps, num_gates=2, weights=[0.5, 0.5],
                 **one_group(2)))
  np.testing.assert_allclose(a, [0.707106, -0.707106], atol=1e-5)
  # Weights are normalised: [2, 2] is [0.5, 0.5]; per-gate thresholds; soft mode uses the
  # smallest gate: R = [1·0.7, 0·0.9].
  for kw in (dict(weights=[2.0, 2.0]), dict(thresholds=[1.0, 0.5], weights=[0.5, 0.5]),
             dict(mode="soft")):
    a = row0(jcall(searchllm_advantages, reward_components=comps, num_gates=2,
                   **one_group(2), **kw))
    np.testing.assert_allclose(a, [0.707106, -0.707106], atol=1e-5)


def test_failed_gates_everywhere_give_zero():
  comps = np.array([[0, 1, 0.8], [1, 0, 0.1], [0, 0, 0.5]], np.float32)
  a = jcall(searchllm_advantages, reward_components=comps, num_gates=2, **one_group(3))
  assert np.all(np.asarray(a) == 0.0)


def test_bad_arguments_raise():
  comps = np.ones((2, 3), np.float32)
  for bad in (3, -1, 1.5):
    with pytest.raises(ValueError, match="num_gates"):
      searchllm_advantages(reward_components=comps, num_gates=bad, **one_group(2))
  with pytest.raises(ValueError, match="weights"):
    searchllm_advantages(reward_components=comps, weights=[0.0, 0.0], **one_group(2))
  with pytest.raises(ValueError, match="mode"):
    searchllm_advantages(reward_components=comps, mode="gated", **one_group(2))
