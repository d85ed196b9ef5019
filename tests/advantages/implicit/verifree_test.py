"""Tests for VeriFree (credit/advantages/implicit/verifree.py); spec §17. Float64 loop
reference from the formulas; registry-wide properties in tests/registry_common_test.py."""
from __future__ import annotations

import functools
import math

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.implicit import verifree as vf
from tests.advantages.implicit._lik import (B, G, N, T, answer_rows, batches, ref_baseline,
                                            to_tokens, valid_rows)

ANS = np.array([[-0.2, -0.1, -0.05], [-1.5, -2.0, -0.7]], np.float32)
CONFIGS = {"default": dict(), "grpo_fast": dict(baseline="grpo", group_size=G),
           "scaled": dict(reward_scale=3.0)}
_STATIC = ("baseline", "group_size")


def ref(b, reward_scale=1.0, baseline="rloo", group_size=None):
  rows = answer_rows(b["logprob_answer"], b["answer_mask"])
  score = [reward_scale * math.exp(sum(r)) if r else 0.0 for r in rows]
  gid = b["group_id"] if group_size is None else np.arange(B) // group_size
  valid = valid_rows(b["response_mask"], gid, group_size=group_size,
                     extra=[bool(r) for r in rows])
  return to_tokens(ref_baseline(score, gid, valid, baseline), b["response_mask"])


@functools.lru_cache(maxsize=None)
def jitted(name):
  static = {k: v for k, v in CONFIGS[name].items() if k in _STATIC}
  return jax.jit(functools.partial(vf.verifree_advantages, num_groups=N, **static))


def test_registered():
  spec = registry.get_estimator("verifree")
  assert spec.family == "implicit" and spec.confidence == "inferred"
  assert "2505.21493" in spec.paper


def test_spec_example():
  # R = exp(Σ) = [0.7047, 0.0150]; RLOO over two samples: ±(0.7047 − 0.0150).
  a = vf.verifree_advantages(group_id=np.zeros(2, np.int32),
                             response_mask=np.ones((2, 1), bool), logprob_answer=ANS,
                             answer_mask=np.ones((2, 3), bool), num_groups=1)
  np.testing.assert_allclose(np.asarray(a)[:, 0], [0.6897, -0.6897], atol=1e-3)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous="group_size" in cfg))
  kw = {k: b[k] for k in ("group_id", "response_mask", "logprob_answer", "answer_mask")}
  hyper = {k: v for k, v in cfg.items() if k not in _STATIC}
  got = np.asarray(jitted(name)(**kw, **hyper), np.float64)
  np.testing.assert_allclose(got, ref(b, **cfg), rtol=1e-4, atol=1e-6)


def test_vanishing_probabilities_stay_finite_and_bad_args():
  lp = np.full((4, 3), -200.0, np.float32)
  a = vf.verifree_advantages(group_id=np.zeros(4, np.int32),
                             response_mask=np.ones((4, T), bool), logprob_answer=lp,
                             answer_mask=np.ones((4, 3), bool), num_groups=1)
  assert np.all(np.asarray(a) == 0.0)
  with pytest.raises(ValueError, match="baseline"):
    vf.verifree_advantages(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, T), bool),
                           logprob_answer=lp, answer_mask=np.ones((4, 3), bool), num_groups=1,
                           baseline="none")
