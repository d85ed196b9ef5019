"""Tests for RLPR (credit/advantages/implicit/rlpr.py). Float64 loop reference
from the formulas; registry-wide properties in tests/registry_common_test.py."""
from __future__ import annotations

import functools
import math

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.implicit import rlpr
from tests.advantages.implicit._lik import (B, G, N, T, answer_rows, batches, ref_baseline,
                                            to_tokens, valid_rows)

ANS = np.array([[-0.2, -0.1, -0.05], [-1.5, -2.0, -0.7]], np.float32)
CONFIGS = {"default": dict(), "raw_rloo": dict(debias=False, baseline="rloo"),
           "fast": dict(group_size=G, reward_scale=2.0),
           "format": dict(format_ok=True, format_coef=0.3, baseline="rloo"),
           "no_format_term": dict(format_ok=True, format_coef=0.0)}
_STATIC = ("baseline", "group_size", "debias", "format_coef")


def ref(b, reward_scale=1.0, debias=True, baseline="grpo", group_size=None, format_ok=None,
        format_coef=0.1):
  """Advantages [B,T]; `format_ok` True: read b["format_ok"] (else every row formatted)."""
  fmt = b["format_ok"] if format_ok else np.ones(B, bool)
  rows = answer_rows(b["logprob_answer"], b["answer_mask"])
  prior = answer_rows(b["logprob_answer_prior"], b["answer_mask"])
  score = []
  for r, p, f in zip(rows, prior, fmt):
    if not r:
      score.append(0.0)
      continue
    x = sum(math.exp(v) for v in r) / len(r)
    if debias:
      x = min(max(x - sum(math.exp(v) for v in p) / len(p), 0.0), 1.0)
    score.append(reward_scale * ((1 - format_coef) * x + format_coef * float(f)))
  gid = b["group_id"] if group_size is None else np.arange(B) // group_size
  valid = valid_rows(b["response_mask"], gid, group_size=group_size,
                     extra=[bool(r) for r in rows])
  return to_tokens(ref_baseline(score, gid, valid, baseline), b["response_mask"])


@functools.lru_cache(maxsize=None)
def jitted(name):
  static = {k: v for k, v in CONFIGS[name].items() if k in _STATIC}
  return jax.jit(functools.partial(rlpr.rlpr_advantages, num_groups=N, **static))


def test_registered():
  spec = registry.get_estimator("rlpr")
  assert spec.family == "implicit" and spec.confidence == "code-verified"
  assert "logprob_answer_prior" in spec.needs and "2506.18254" in spec.paper
  # The code's format term (c = 0.1) is on by default, so the runner asks for format_ok.
  assert spec.needs_for({}) == spec.needs | {"format_ok"}
  assert spec.needs_for({"format_coef": 0.0}) == spec.needs


def test_spec_example():
  m = np.ones((2, 3), bool)
  r = rlpr.rlpr_reward(logprob_answer=ANS, answer_mask=m)
  np.testing.assert_allclose(np.asarray(r), [0.8916, 0.2850], atol=1e-4)
  r = rlpr.rlpr_reward(logprob_answer=ANS, answer_mask=m,
                       logprob_answer_prior=np.full((2, 3), -1.0, np.float32))
  np.testing.assert_allclose(np.asarray(r), [0.5237, 0.0], atol=1e-4)
  # The format term: S = 0.9·[0.5237, 0] + 0.1·[1, 0] = [0.5713, 0]; RLOO over the two
  # gives ±0.5713.
  a = rlpr.rlpr_advantages(group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 1), bool),
                           logprob_answer=ANS, answer_mask=m,
                           logprob_answer_prior=np.full((2, 3), -1.0, np.float32),
                           num_groups=1, format_ok=np.array([True, False]), baseline="rloo")
  np.testing.assert_allclose(np.asarray(a)[:, 0], [0.5713, -0.5713], atol=1e-4)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous="group_size" in cfg))
  kw = {k: b[k] for k in ("group_id", "response_mask", "logprob_answer", "answer_mask",
                          "logprob_answer_prior")}
  if cfg.get("format_ok"):
    b["format_ok"] = np.array(data.draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    kw["format_ok"] = b["format_ok"]
  hyper = {k: v for k, v in cfg.items() if k not in _STATIC and k != "format_ok"}
  got = np.asarray(jitted(name)(**kw, **hyper), np.float64)
  np.testing.assert_allclose(got, ref(b, **cfg), rtol=1e-4, atol=1e-5)


def test_bad_args_raise():
  kw = dict(group_id=np.zeros(2, np.int32), response_mask=np.ones((2, T), bool),
            logprob_answer=ANS, answer_mask=np.ones((2, 3), bool), num_groups=1)
  with pytest.raises(ValueError, match="logprob_answer_prior"):
    rlpr.rlpr_advantages(logprob_answer_prior=None, **kw)
  rlpr.rlpr_advantages(logprob_answer_prior=None, debias=False, **kw)
  with pytest.raises(ValueError, match="debias"):
    rlpr.rlpr_advantages(logprob_answer_prior=ANS, debias="yes", **kw)
  with pytest.raises(AssertionError):
    rlpr.rlpr_advantages(logprob_answer_prior=ANS[:, :2], **kw)
  with pytest.raises(ValueError, match="format_coef"):
    rlpr.rlpr_advantages(logprob_answer_prior=ANS, format_coef=1.5, **kw)
  with pytest.raises(AssertionError):
    rlpr.rlpr_advantages(logprob_answer_prior=ANS, format_ok=np.ones(3, bool), **kw)
