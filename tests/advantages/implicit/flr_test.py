"""Tests for FLR (credit/advantages/implicit/flr.py). Float64 loop reference from
the formulas; registry-wide properties in tests/registry_common_test.py."""
from __future__ import annotations

import functools

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.implicit import flr
from tests.advantages.implicit._lik import (B, F, G, N, T, batches, ref_baseline, to_tokens,
                                            valid_rows)

CONFIGS = {"default": dict(), "two_pos_grpo": dict(num_positive=2, baseline="grpo"),
           "all_pos_fast": dict(num_positive=F, group_size=G, reward_scale=0.5)}
_STATIC = ("baseline", "group_size", "num_positive")


def ref(b, num_positive=1, reward_scale=1.0, baseline="rloo", group_size=None):
  lf = b["logprob_followup"].astype(np.float64)
  score = []
  for row in lf:
    pos = list(row[:num_positive])
    neg = list(row[num_positive:])
    score.append(reward_scale * ((sum(pos) / len(pos) if pos else 0.0)
                                 - (sum(neg) / len(neg) if neg else 0.0)))
  gid = b["group_id"] if group_size is None else np.arange(B) // group_size
  valid = valid_rows(b["response_mask"], gid, group_size=group_size)
  return to_tokens(ref_baseline(score, gid, valid, baseline), b["response_mask"])


@functools.lru_cache(maxsize=None)
def jitted(name):
  static = {k: v for k, v in CONFIGS[name].items() if k in _STATIC}
  return jax.jit(functools.partial(flr.flr_advantages, num_groups=N, **static))


def test_registered():
  spec = registry.get_estimator("flr")
  assert spec.family == "implicit" and spec.confidence == "inferred"
  assert spec.needs == {"group_id", "response_mask", "logprob_followup"}
  assert "2409.13948" in spec.paper


def test_spec_example():
  # Sums [−12, −15] (lengths 6, 8) positive, [−16, −14] (lengths 7, 7) negative.
  lf = np.array([[-12 / 6, -15 / 8, -16 / 7, -14 / 7], [-20 / 6, -18 / 8, -13 / 7, -15 / 7]],
                np.float32)
  r = flr.flr_reward(logprob_followup=lf, num_positive=2)
  np.testing.assert_allclose(np.asarray(r), [0.2054, -0.7917], atol=1e-4)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous="group_size" in cfg))
  kw = {k: b[k] for k in ("group_id", "response_mask", "logprob_followup")}
  hyper = {k: v for k, v in cfg.items() if k not in _STATIC}
  got = np.asarray(jitted(name)(**kw, **hyper), np.float64)
  np.testing.assert_allclose(got, ref(b, **cfg), rtol=1e-4, atol=1e-5)


def test_bad_args_raise():
  kw = dict(group_id=np.zeros(2, np.int32), response_mask=np.ones((2, T), bool),
            logprob_followup=np.zeros((2, 3), np.float32), num_groups=1)
  with pytest.raises(ValueError, match="num_positive"):
    flr.flr_advantages(num_positive=4, **kw)
  with pytest.raises(ValueError, match="num_positive"):
    flr.flr_advantages(num_positive=-1, **kw)
  with pytest.raises(ValueError, match="baseline"):
    flr.flr_advantages(baseline="dpo", **kw)
