"""Tests for the EAPO estimator (credit/advantages/token/eapo.py).

Spec: shared/methods/token_and_implicit.md §9. The numpy reference is written from the
formulas (float64 loops). Registry-wide properties (jit == eager, masking, padding,
permutation, degenerate groups, sharding) live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools
import math

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.token import eapo as ea
from tests.advantages.token._ref import (EPS, G, N, T, B, batches, pick, ref_grpo,
                                         valid_tokens)

H = np.array([0.2, 1.5, 0.4, 0.9])
SPEC_Z = [-1.0945, 1.4926, -0.6965, 0.2985]
SPEC_POS = [0.6167, 1.4905, 0.7175, 1.1754]
SPEC_NEG = [-1.3640, -0.5343, -1.2683, -0.8335]

CONFIGS = {
    "default": dict(),
    "population_alpha": dict(group_std="population", alpha=0.9),
    "no_renorm": dict(renormalize=False, alpha=0.3),
    "nostd_fast": dict(group_std="none", group_size=G),
}
FIELDS = ("reward", "group_id", "response_mask", "entropy")


def ref_eapo(b, *, group_size=None, alpha=0.5, renormalize=True, group_std="unbiased",
             eps=EPS):
  mask = b["response_mask"]
  adv = ref_grpo(b["reward"], b["group_id"], mask, group_size=group_size, group_std=group_std)
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    ts = valid_tokens(mask, i)
    if not ts:
      continue
    h = [float(b["entropy"][i, t]) for t in ts]
    mu = sum(h) / len(h)
    sd = math.sqrt(sum((x - mu) ** 2 for x in h) / len(h))
    sgn = float(np.sign(adv[i]))
    w = [max(1 + alpha * sgn * math.tanh((x - mu) / (sd + eps)), 0.0) for x in h]
    if renormalize:
      w = [len(ts) * x / sum(w) for x in w]
    for t, x in zip(ts, w):
      out[i, t] = adv[i] * x
  return out


@functools.lru_cache(maxsize=None)
def jitted(name):
  return jax.jit(functools.partial(ea.eapo_advantages, num_groups=N, **CONFIGS[name]))


def test_registered_in_token_family():
  spec = registry.get_estimator("eapo")
  assert spec.family == "token" and spec.confidence == "inferred"
  assert spec.fn is ea.eapo_advantages
  assert spec.needs == set(FIELDS)
  assert "2604.11056" in spec.paper


def test_doctests():
  res = doctest.testmod(ea, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  mask = np.ones((2, 4), bool)
  ent = np.tile(H.astype(np.float32), (2, 1))
  z = np.arctanh(np.asarray(ea.eapo_entropy_scores(response_mask=mask[:1], entropy=ent[:1])))
  np.testing.assert_allclose(z[0], SPEC_Z, atol=1e-3)
  # Two rows with rewards 1, 0 and the population std: Â = ±1.
  a = ea.eapo_advantages(reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
                         response_mask=mask, entropy=ent, num_groups=1,
                         group_std="population")
  np.testing.assert_allclose(np.asarray(a), [SPEC_POS, SPEC_NEG], atol=1e-3)
  np.testing.assert_allclose(np.asarray(a).sum(-1), [4.0, -4.0], atol=1e-4)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous=cfg.get("group_size") is not None))
  got = np.asarray(jitted(name)(**pick(b, *FIELDS)), np.float64)
  np.testing.assert_allclose(got, ref_eapo(b, **cfg), rtol=1e-4, atol=1e-5)


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_reduces_to_grpo_and_keeps_sign_and_budget(b):
  grpo = np.asarray(grpo_advantages(**pick(b, "reward", "group_id", "response_mask"),
                                    num_groups=N))
  kw = pick(b, *FIELDS)
  a0 = ea.eapo_advantages(num_groups=N, alpha=0.0, **kw)
  np.testing.assert_allclose(np.asarray(a0), grpo, rtol=1e-6, atol=1e-7)
  flat = dict(kw, entropy=np.full((B, T), 1.3, np.float32))
  a1 = ea.eapo_advantages(num_groups=N, **flat)
  np.testing.assert_allclose(np.asarray(a1), grpo, rtol=1e-5, atol=1e-6)
  a = np.asarray(ea.eapo_advantages(num_groups=N, **kw), np.float64)
  np.testing.assert_array_equal(np.sign(a), np.sign(grpo))
  np.testing.assert_allclose(a.sum(-1), grpo.astype(np.float64).sum(-1), rtol=1e-4, atol=1e-4)


def test_polarity():
  # Success: the highest-entropy token gets the most credit; failure: the lowest the most blame.
  ent = np.tile(np.array([0.1, 2.0, 0.5], np.float32), (2, 1))
  a = np.asarray(ea.eapo_advantages(reward=np.array([1.0, 0.0]),
                                    group_id=np.zeros(2, np.int32),
                                    response_mask=np.ones((2, 3), bool), entropy=ent,
                                    num_groups=1))
  assert np.argmax(a[0]) == 1 and np.argmin(a[1]) == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(group_std="sample"), "group_std"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
    (dict(num_groups=0), "num_groups"),
])
def test_bad_static_args_raise(kwargs, match):
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), entropy=np.ones((B, T), np.float32),
              num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    ea.eapo_advantages(**base)


def test_shape_mismatch_raises():
  with pytest.raises(AssertionError):
    ea.eapo_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                       response_mask=np.ones((B, T), bool),
                       entropy=np.ones((B, T + 1), np.float32), num_groups=N)
