"""SCOPE (credit/advantages/distill/scope.py); spec distill_and_structure.md A2."""
from __future__ import annotations

import doctest
import functools

import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.distill import scope
from tests.advantages.distill._ref_teach import (B, G, N, T, batch, pick, ref_scope,
                                                 ref_scope_weights, row_valid)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher")
CONFIGS = {
    "default": dict(),
    "tempered": dict(temperature=0.5, mle_coef=0.3, success_threshold=0.5),
    "fast": dict(group_size=G),
}


@functools.lru_cache(maxsize=None)
def jitted(name):
  return jax.jit(functools.partial(scope.scope_advantages, num_groups=N, **CONFIGS[name]))


def test_registered():
  spec = registry.get_estimator("scope")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(scope, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  lp = lambda ppl: -np.log(np.asarray(ppl, np.float32))[:, None]
  w, correct = scope.scope_weights(
      reward=np.array([1., 1., 0., 0.]), group_id=np.zeros(4, np.int32),
      response_mask=np.ones((4, 1), bool), logprob_old=lp([1.2, 2.0, 1.0, 1.0]),
      logprob_teacher=lp([1.0, 1.0, 1.5, 3.0]), num_groups=1)
  np.testing.assert_allclose(np.asarray(w), [0.75, 1.25, 1.333333, 0.666667], atol=1e-5)
  assert np.asarray(correct).tolist() == [True, True, False, False]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_numpy_reference(name, seed):
  cfg = dict(CONFIGS[name])
  b = batch(seed, contiguous="group_size" in cfg)
  got = np.asarray(jitted(name)(**pick(b, *FIELDS)), np.float64)
  np.testing.assert_allclose(got, ref_scope(b, **cfg), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", [2, 3])
def test_weights_are_mean_one_per_group_and_path(seed):
  b = batch(seed)
  w, correct = scope.scope_weights(**pick(b, *FIELDS), num_groups=N)
  w, correct, valid = np.asarray(w), np.asarray(correct), row_valid(b)
  np.testing.assert_allclose(w, ref_scope_weights(b), rtol=1e-4, atol=1e-6)
  assert np.all(w[~valid] == 0.0) and np.all(w[valid] > 0.0)
  for g in range(N):
    for path in (True, False):
      on = valid & (b["group_id"] == g) & (correct == path)
      if on.any():
        np.testing.assert_allclose(w[on].mean(), 1.0, rtol=1e-5)


def test_paths_and_signs():
  b = batch(4)
  a = np.asarray(jitted("default")(**pick(b, *FIELDS)))
  correct = (b["reward"] >= 1.0)[:, None] & b["response_mask"] & row_valid(b)[:, None]
  assert np.all(a[correct] > 0.0)                    # MLE path: λ·w > 0 on every token
  # Failed path: the sign of the teacher gap is kept (w > 0).
  same = dict(b, logprob_teacher=b["logprob_old"])
  a = np.asarray(jitted("default")(**pick(same, *FIELDS)))
  assert np.all(a[~correct] == 0.0)


def test_no_gradient_and_bad_shape():
  b = batch(5)
  f = lambda lo: scope.scope_advantages(**dict(pick(b, *FIELDS), logprob_old=lo),
                                        num_groups=N).sum()
  assert np.all(np.asarray(jax.grad(f)(np.full((B, T), -1.0, np.float32))) == 0.0)
  with pytest.raises(AssertionError):
    scope.scope_advantages(**dict(pick(b, *FIELDS), logprob_teacher=np.zeros((B, T + 1))),
                           num_groups=N)
