"""Tests for the log-prob reward estimator (credit/advantages/implicit/logprob_reward.py).

Float64 loop reference from the formulas;
registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import functools

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.implicit import logprob_reward as lr
from tests.advantages.implicit._lik import (B, G, N, T, answer_rows, batches, ref_baseline,
                                            to_tokens, valid_rows)

# Worked example: two answers of three tokens.
ANS = np.array([[-0.2, -0.1, -0.05], [-1.5, -2.0, -0.7]], np.float32)

CONFIGS = {"default": dict(), "mean_grpo": dict(length_normalize=True, baseline="grpo"),
           "floor_fast": dict(floor=-1.5, group_size=G)}
_STATIC = ("length_normalize", "baseline", "group_size")


def ref(b, floor=-100.0, length_normalize=False, baseline="rloo", group_size=None):
  rows = answer_rows(b["logprob_answer"], b["answer_mask"])
  score = [max((sum(r) / len(r) if length_normalize else sum(r)), floor) if r else 0.0
           for r in rows]
  gid = b["group_id"] if group_size is None else np.arange(B) // group_size
  valid = valid_rows(b["response_mask"], gid, group_size=group_size,
                     extra=[bool(r) for r in rows])
  return to_tokens(ref_baseline(score, gid, valid, baseline), b["response_mask"])


@functools.lru_cache(maxsize=None)
def jitted(name):
  static = {k: v for k, v in CONFIGS[name].items() if k in _STATIC}
  return jax.jit(functools.partial(lr.logprob_reward_advantages, num_groups=N, **static))


def test_registered():
  spec = registry.get_estimator("logprob_reward")
  assert spec.family == "implicit" and spec.confidence == "inferred"
  assert spec.needs == {"group_id", "response_mask", "logprob_answer", "answer_mask"}
  assert "2602.03979" in spec.paper


def test_spec_example():
  m = np.ones((2, 3), bool)
  r = lr.answer_logprob_reward(logprob_answer=ANS, answer_mask=m)
  np.testing.assert_allclose(np.asarray(r), [-0.35, -4.2], atol=1e-4)
  a = lr.logprob_reward_advantages(group_id=np.zeros(2, np.int32),
                                   response_mask=np.ones((2, 2), bool), logprob_answer=ANS,
                                   answer_mask=m, num_groups=1)
  np.testing.assert_allclose(np.asarray(a), [[3.85, 3.85], [-3.85, -3.85]], atol=1e-4)
  r = lr.answer_logprob_reward(logprob_answer=ANS, answer_mask=m, floor=-2.0)
  np.testing.assert_allclose(np.asarray(r), [-0.35, -2.0], atol=1e-6)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous="group_size" in cfg))
  kw = {k: b[k] for k in ("group_id", "response_mask", "logprob_answer", "answer_mask")}
  hyper = {k: v for k, v in cfg.items() if k not in _STATIC}
  got = np.asarray(jitted(name)(**kw, **hyper), np.float64)
  np.testing.assert_allclose(got, ref(b, **cfg), rtol=1e-4, atol=1e-5)


def test_empty_answers_and_bad_args():
  m = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 0]], bool)
  a = np.asarray(lr.logprob_reward_advantages(
      group_id=np.zeros(3, np.int32), response_mask=np.ones((3, T), bool),
      logprob_answer=np.where(m, -1.0, np.nan).astype(np.float32), answer_mask=m,
      num_groups=1))
  assert np.all(np.isfinite(a)) and np.all(a[1] == 0.0)
  np.testing.assert_allclose(a[0], -a[2])         # two valid rows: ±(−3 − (−1))
  with pytest.raises(ValueError, match="baseline"):
    lr.logprob_reward_advantages(group_id=np.zeros(3, np.int32),
                                 response_mask=np.ones((3, T), bool),
                                 logprob_answer=np.zeros((3, 3), np.float32), answer_mask=m,
                                 num_groups=1, baseline="grpoo")
  with pytest.raises(AssertionError):
    lr.logprob_reward_advantages(group_id=np.zeros(3, np.int32),
                                 response_mask=np.ones((3, T), bool),
                                 logprob_answer=np.zeros((2, 3), np.float32),
                                 answer_mask=np.ones((2, 3), bool), num_groups=1)
