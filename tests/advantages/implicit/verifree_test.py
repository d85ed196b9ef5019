"""Tests for VeriFree (credit/advantages/implicit/verifree.py). Float64 loop
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
           "scaled": dict(reward_scale=3.0, answer_weight="advantage"),
           "one": dict(answer_weight="one"),
           "gated": dict(format_ok=True, answer_weight="advantage"),
           "gate_off": dict(format_ok=True, format_gate=False, answer_weight="one")}
_STATIC = ("baseline", "group_size", "answer_weight", "format_gate")


def ref(b, reward_scale=1.0, baseline="rloo", group_size=None, answer_weight="reward",
        format_ok=None, format_gate=True):
  """(advantages [B,T], answer weights [B]); `format_ok` True: read b["format_ok"]."""
  del format_gate  # only what the registry asks for; a given format_ok applies either way
  rows = answer_rows(b["logprob_answer"], b["answer_mask"])
  ok = b["format_ok"] if format_ok else np.ones(B, bool)
  score = [reward_scale * math.exp(sum(r)) if r and ok[i] else 0.0
           for i, r in enumerate(rows)]
  gid = b["group_id"] if group_size is None else np.arange(B) // group_size
  valid = valid_rows(b["response_mask"], gid, group_size=group_size,
                     extra=[bool(r) for r in rows])
  adv = ref_baseline(score, gid, valid, baseline)
  w = {"reward": score, "advantage": adv, "one": np.ones(B)}[answer_weight]
  return to_tokens(adv, b["response_mask"]), np.where(np.asarray(valid) & ok, w, 0.0)


@functools.lru_cache(maxsize=None)
def jitted(name):
  static = {k: v for k, v in CONFIGS[name].items() if k in _STATIC}
  return jax.jit(functools.partial(vf.verifree_advantages, num_groups=N, **static))


def test_registered():
  spec = registry.get_estimator("verifree")
  assert spec.family == "implicit" and spec.confidence == "code-verified"
  assert spec.trained_loss.scores == ("logprob_answer",)
  assert "2505.21493" in spec.paper
  # The port's format gate is on by default, so the runner asks for format_ok.
  assert spec.needs_for({}) == spec.needs | {"format_ok"}
  assert spec.needs_for({"format_gate": False}) == spec.needs


def test_spec_example():
  # R = exp(Σ) = [0.7047, 0.0150]; RLOO over two samples: ±(0.7047 − 0.0150).
  out = vf.verifree_advantages(group_id=np.zeros(2, np.int32),
                               response_mask=np.ones((2, 1), bool), logprob_answer=ANS,
                               answer_mask=np.ones((2, 3), bool), num_groups=1)
  np.testing.assert_allclose(np.asarray(out.advantages)[:, 0], [0.6897, -0.6897], atol=1e-3)
  # The answer term (the released run: w = R): −mean_b R_b Σ_j ℓ_bj
  #   = (0.7047·0.35 + 0.0150·4.2) / 2 = 0.1548.
  np.testing.assert_allclose(np.asarray(out.answer_weight), [0.7047, 0.0150], atol=1e-4)
  loss = vf.answer_likelihood_loss(logprob_answer=ANS, answer_mask=np.ones((2, 3), bool),
                                   answer_weight=out.answer_weight)
  np.testing.assert_allclose(float(loss), 0.1548, atol=1e-4)
  # Its gradient is −w_b/B on each answer token; masked answer tokens get none.
  amask = np.array([[1, 1, 0], [1, 1, 1]], bool)
  g = jax.grad(lambda x: vf.answer_likelihood_loss(logprob_answer=x, answer_mask=amask,
                                                   answer_weight=np.array([2.0, 1.0])))(ANS)
  np.testing.assert_allclose(np.asarray(g), [[-1, -1, 0], [-0.5, -0.5, -0.5]])
  # The port's gate: the second response has no answer tag (or hit the length limit), so
  # R = [0.7047, 0] (it stays in the RLOO baseline) and it trains no answer tokens.
  out = vf.verifree_advantages(group_id=np.zeros(2, np.int32),
                               response_mask=np.ones((2, 1), bool), logprob_answer=ANS,
                               answer_mask=np.ones((2, 3), bool), num_groups=1,
                               format_ok=np.array([True, False]))
  np.testing.assert_allclose(np.asarray(out.advantages)[:, 0], [0.7047, -0.7047], atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.answer_weight), [0.7047, 0.0], atol=1e-4)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous="group_size" in cfg))
  kw = {k: b[k] for k in ("group_id", "response_mask", "logprob_answer", "answer_mask")}
  if cfg.get("format_ok"):
    b["format_ok"] = np.array(data.draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    kw["format_ok"] = b["format_ok"]
  hyper = {k: v for k, v in cfg.items() if k not in _STATIC and k != "format_ok"}
  out = jitted(name)(**kw, **hyper)
  adv, w = ref(b, **cfg)
  np.testing.assert_allclose(np.asarray(out.advantages, np.float64), adv, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(out.answer_weight, np.float64), w, rtol=1e-4,
                             atol=1e-6)


def test_vanishing_probabilities_stay_finite_and_bad_args():
  lp = np.full((4, 3), -200.0, np.float32)
  a = vf.verifree_advantages(group_id=np.zeros(4, np.int32),
                             response_mask=np.ones((4, T), bool), logprob_answer=lp,
                             answer_mask=np.ones((4, 3), bool), num_groups=1)
  assert np.all(np.asarray(a.advantages) == 0.0)
  with pytest.raises(ValueError, match="answer_weight"):
    vf.verifree_advantages(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, T), bool),
                           logprob_answer=lp, answer_mask=np.ones((4, 3), bool), num_groups=1,
                           answer_weight="adv")
  with pytest.raises(AssertionError, match="format_ok|shape"):
    vf.verifree_advantages(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, T), bool),
                           logprob_answer=lp, answer_mask=np.ones((4, 3), bool), num_groups=1,
                           format_ok=np.ones(3, bool))
  with pytest.raises(ValueError, match="baseline"):
    vf.verifree_advantages(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, T), bool),
                           logprob_answer=lp, answer_mask=np.ones((4, 3), bool), num_groups=1,
                           baseline="none")
