"""Tests for the SIPO estimator (credit/advantages/distill/sipo.py).

The formula is inferred from the abstract (see the docs page). The numpy
reference (`_ref_ctx.ref_sipo`) is written from the formula. Registry-wide properties
(jit/eager, masking, padding, permutation, degenerate batches) live in
tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools

import hypothesis
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import sipo
from tests.advantages.distill._harness import hypothesis_reference_test, table
from tests.advantages.distill._ref_ctx import B, G, N, T, batches, pick, ref_sipo

FIELDS = ("reward", "group_id", "response_mask", "logprob_alt_pos", "logprob_alt_neg")
CONFIGS = {
    "default": dict(),
    "always_population": dict(contrast="always", group_std="population", beta=0.5),
    "tight_fast": dict(kappa=0.3, success_threshold=0.5, group_size=G),
}


@functools.lru_cache(maxsize=None)
def _compiled(static):
  return jax.jit(functools.partial(sipo.sipo_advantages, **dict(static)))


def jitted(name):
  return _compiled(tuple(sorted(dict(CONFIGS[name], num_groups=N).items())))


_grpo = jax.jit(functools.partial(grpo_advantages, num_groups=N))


def call(data, **static):
  """The jitted estimator on `data` (compiled once per static configuration and shape)."""
  return np.asarray(_compiled(tuple(sorted(static.items())))(**data))


def test_registered():
  spec = registry.get_estimator("sipo")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(sipo, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  # An all-fail group of two: A_grpo = 0, the group has a mistake, so A = clip(ℓ⁺ − ℓ⁻).
  pos = np.array([[-0.2, -1.0, -0.7]] * 2, np.float32)
  neg = np.array([[-0.5, -0.4, -0.7]] * 2, np.float32)
  a = call(dict(reward=np.zeros(2, np.float32), group_id=np.zeros(2, np.int32),
                response_mask=np.ones((2, 3), bool), logprob_alt_pos=pos, logprob_alt_neg=neg),
           num_groups=1)
  np.testing.assert_allclose(a, [[0.3, -0.6, 0.0]] * 2, atol=1e-5)


CASES = table(sipo.sipo_advantages, FIELDS, ref_sipo, CONFIGS, strategy=batches, num_groups=N,
              rtol=1e-4, atol=1e-5)
test_matches_numpy_reference = hypothesis_reference_test(CASES, max_examples=4)


@hypothesis.settings(max_examples=3, deadline=None)
@hypothesis.given(b=batches())
def test_reductions_to_grpo(b):
  grpo = np.asarray(_grpo(**pick(b, "reward", "group_id", "response_mask")))
  kw = pick(b, *FIELDS)
  same = dict(kw, logprob_alt_neg=b["logprob_alt_pos"])  # identical contexts cancel
  for a in (jitted("default")(**same), call(kw, num_groups=N, beta=0.0)):
    np.testing.assert_allclose(np.asarray(a), grpo, rtol=1e-5, atol=1e-6)


def test_contrast_needs_a_mistake_in_the_group():
  pos = np.full((4, T), -0.2, np.float32)
  neg = np.full((4, T), -1.0, np.float32)
  kw = dict(group_id=np.array([0, 0, 1, 1], np.int32), response_mask=np.ones((4, T), bool),
            logprob_alt_pos=pos, logprob_alt_neg=neg,
            reward=np.array([1.0, 1.0, 1.0, 0.0], np.float32))  # group 0 all correct
  a = call(kw, num_groups=2)
  np.testing.assert_array_equal(a[:2], 0.0)            # no mistake: pure GRPO (= 0)
  grpo1 = np.array([0.5, -0.5]) / (np.sqrt(0.5) + 1e-6)
  np.testing.assert_allclose(a[2:, 0], grpo1 + 0.8, rtol=1e-5)
  always = call(kw, num_groups=2, contrast="always")
  np.testing.assert_allclose(always[:2], 0.8, rtol=1e-6)   # generic mistake context


def test_contrast_is_clipped_and_safe_on_infinite_logprobs():
  pos = np.array([[0.0, -np.inf, -np.inf, -1e9, -0.1, np.nan]], np.float32)
  neg = np.array([[-5.0, 0.0, -np.inf, 0.0, -0.1, -1.0]], np.float32)
  a = call(dict(reward=np.zeros(1, np.float32), group_id=np.zeros(1, np.int32),
                response_mask=np.ones((1, 6), bool), logprob_alt_pos=pos, logprob_alt_neg=neg),
           num_groups=1, kappa=0.5)
  np.testing.assert_array_equal(a, [[0.5, -0.5, 0.0, -0.5, 0.0, 0.0]])


@pytest.mark.parametrize("kwargs,match", [
    (dict(contrast="sometimes"), "contrast"),
    (dict(group_std="sample"), "group_std"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  z = np.zeros((B, T), np.float32)
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), logprob_alt_pos=z, logprob_alt_neg=z,
              num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    sipo.sipo_advantages(**base)


def test_shape_mismatch_raises():
  z = np.zeros((B, T), np.float32)
  with pytest.raises(AssertionError):
    sipo.sipo_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                         response_mask=np.ones((B, T), bool), logprob_alt_pos=z,
                         logprob_alt_neg=np.zeros((B, T + 1), np.float32), num_groups=N)
