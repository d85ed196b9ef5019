"""Tests for the OPSA estimator (credit/advantages/token/opsa.py).

Spec: shared/methods/token_and_implicit.md §10. The numpy reference is written from the
formula. Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.token import opsa as op
from tests.advantages.token._ref import EPS, G, N, T, B, batches, pick, ref_grpo

CONFIGS = {
    "default": dict(),
    "coef": dict(coef=0.3),
    "constant": dict(mode="constant", coef=0.7),
    "outcome": dict(outcome_coef=0.5),
    "outcome_fast": dict(outcome_coef=1.0, group_size=G, group_std="population"),
}


def ref_opsa(b, *, coef=1.0, outcome_coef=0.0, mode="entropy", group_size=None,
             group_std="unbiased", eps=EPS):
  mask = b["response_mask"]
  ent = np.maximum(b["entropy"].astype(np.float64), 0.0)
  vals = [ent[i, t] for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
  mean = sum(vals) / max(len(vals), 1)
  adv = (ref_grpo(b["reward"], b["group_id"], mask, group_size=group_size, group_std=group_std)
         if outcome_coef else np.zeros(mask.shape[0]))
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      if mask[i, t]:
        base = -coef * ent[i, t] / (mean + eps) if mode == "entropy" else -coef
        out[i, t] = base + outcome_coef * adv[i]
  return out


@functools.lru_cache(maxsize=None)
def jitted(name):
  cfg = dict(CONFIGS[name])
  return jax.jit(functools.partial(op.opsa_advantages, num_groups=N, **cfg))


def _fields(name, b):
  names = ["response_mask", "entropy"]
  if CONFIGS[name].get("outcome_coef"):
    names += ["reward", "group_id"]
  return pick(b, *names)


def test_registered_in_token_family():
  spec = registry.get_estimator("opsa")
  assert spec.family == "token" and spec.confidence == "inferred"
  assert spec.needs == {"response_mask", "entropy"}
  assert spec.needs_for({"outcome_coef": 0.5}) == {"response_mask", "entropy", "reward",
                                                    "group_id"}


def test_doctests():
  res = doctest.testmod(op, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  h = np.array([[0.1, 1.0, 2.0], [0.5, 0.5, 0.0]], np.float32)
  m = np.array([[1, 1, 1], [1, 1, 0]], bool)
  a = np.asarray(op.opsa_advantages(response_mask=m, entropy=h))
  np.testing.assert_allclose(a, [[-0.1220, -1.2195, -2.4390], [-0.6098, -0.6098, 0.0]],
                             atol=1e-3)
  c = np.asarray(op.opsa_advantages(response_mask=m, entropy=h, mode="constant", coef=2.0))
  np.testing.assert_array_equal(c, np.where(m, -2.0, 0.0))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous=cfg.get("group_size") is not None))
  got = np.asarray(jitted(name)(**_fields(name, b)), np.float64)
  np.testing.assert_allclose(got, ref_opsa(b, **cfg), rtol=1e-4, atol=1e-5)


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_reductions(b):
  kw = pick(b, "response_mask", "entropy")
  grpo = np.asarray(grpo_advantages(**pick(b, "reward", "group_id", "response_mask"),
                                    num_groups=N))
  # c = 0 with an outcome term of weight 1 is GRPO.
  a = op.opsa_advantages(coef=0.0, outcome_coef=1.0, num_groups=N,
                         **pick(b, "reward", "group_id"), **kw)
  np.testing.assert_allclose(np.asarray(a), grpo, rtol=1e-6, atol=1e-7)
  # A constant entropy makes the entropy mode the constant mode.
  flat = dict(kw, entropy=np.full((B, T), 0.8, np.float32))
  np.testing.assert_allclose(np.asarray(op.opsa_advantages(**flat)),
                             np.asarray(op.opsa_advantages(mode="constant", **flat)),
                             rtol=1e-5)
  # Non-positive everywhere; the mean over valid tokens is -c (entropy mode).
  a = np.asarray(op.opsa_advantages(**kw), np.float64)
  assert np.all(a <= 0)
  mask = b["response_mask"]
  if mask.any() and b["entropy"][mask].sum() > 1e-3:
    np.testing.assert_allclose(a[mask].mean(), -1.0, rtol=1e-4)


def test_zero_entropy_gives_zero():
  m = np.ones((2, 3), bool)
  a = np.asarray(op.opsa_advantages(response_mask=m, entropy=np.zeros((2, 3), np.float32)))
  assert np.all(a == 0.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="tail"), "mode"),
    (dict(group_std="sample"), "group_std"),
    (dict(outcome_coef=0.5), "needs `reward`"),
    (dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32)), "num_groups"),
])
def test_bad_args_raise(kwargs, match):
  base = dict(response_mask=np.ones((B, T), bool), entropy=np.ones((B, T), np.float32))
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    op.opsa_advantages(**base)


def test_shape_mismatch_raises():
  with pytest.raises(AssertionError):
    op.opsa_advantages(response_mask=np.ones((B, T), bool),
                       entropy=np.ones((B, T + 1), np.float32))
