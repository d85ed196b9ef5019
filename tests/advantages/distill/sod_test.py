"""SOD (credit/advantages/distill/sod.py).

Registry-wide properties (jit, masking, padding, permutations, degenerate batches) live in
tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import _steps, sod
from tests.advantages.distill._harness import reference_test, table
from tests.advantages.distill._ref_steps import (B, G, N, T, call, make_batch, pick,
                                               ref_sod)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher")
MASK = np.array([[1, 1, 0, 1, 1, 0, 1]] * 2, bool)
LP_S = np.array([[-1.0, -0.5, 0, -0.2, -0.6, 0, -1.0]] * 2, np.float32)
LP_T = np.array([[-0.8, -0.3, 0, -0.6, -1.0, 0, -1.1]] * 2, np.float32)
CONFIGS = {
    "default": dict(),
    "fast_config_delta": dict(group_size=G, delta=0.5, alpha=0.5),
    "two_steps_population": dict(num_steps=2, group_std="population"),
    "gated": dict(mode="gated"),
}


CASES = table(sod.sod_advantages, FIELDS, ref_sod, CONFIGS, batch=make_batch, num_groups=N, seeds=(0,),
              default_seeds=(0, 1), rtol=1e-4, atol=1e-5)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("sod")
  assert spec.family == "distill" and spec.confidence == "code-verified"
  assert spec.needs == set(FIELDS)


@pytest.mark.parametrize("module", [sod, _steps], ids=["sod", "_steps"])
def test_doctests(module):
  res = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  w = call(sod.sod_step_weights, response_mask=MASK[:1], logprob_old=LP_S[:1],
                           logprob_teacher=LP_T[:1])
  np.testing.assert_allclose(np.asarray(w[0]), [1, 1, 0, 0.500001, 0.500001, 0, 1.2], atol=1e-5)
  a = call(sod.sod_advantages, reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
                         response_mask=MASK, logprob_old=LP_S, logprob_teacher=LP_T,
                         num_groups=1, group_std="none")               # Â = ±0.5
  np.testing.assert_allclose(np.asarray(a[0]), [0.7, 0.7, 0, 0.3, 0.3, 0, 0.38], atol=1e-5)
  # Legacy gate: Ā = [1, −1] → β = [0.026894, 0.073106] (teacher − student = 1 on one token).
  one = np.ones((2, 1), bool)
  a = call(sod.sod_advantages, reward=np.array([1.0, -1.0]), group_id=np.zeros(2, np.int32),
                         response_mask=one, logprob_old=np.full((2, 1), -2.0),
                         logprob_teacher=np.full((2, 1), -1.0), num_groups=1,
                         group_std="none", mode="gated")               # Ā = ±1
  np.testing.assert_allclose(np.asarray(a[:, 0]) - [1.0, -1.0], [0.026894, 0.073106],
                             atol=1e-5)


def test_teacher_equal_student_gives_grpo():
  b = make_batch(2, extreme=False)
  kw = dict(pick(b, *FIELDS), logprob_teacher=b["logprob_old"])
  grpo = call(grpo_advantages, **pick(b, "reward", "group_id", "response_mask"),
              num_groups=N)
  for mode in ("stepwise", "gated"):
    np.testing.assert_allclose(call(sod.sod_advantages, num_groups=N, mode=mode, **kw),
                               grpo, rtol=1e-6, atol=1e-7)


def test_weight_bounds_and_edge_cases():
  # Weights lie in [0, 1+δ]; the first step has weight 1; d_1 = 0 mutes a diverging later step.
  b = make_batch(3)
  w = call(sod.sod_step_weights, **pick(b, "response_mask", "logprob_old", "logprob_teacher"))
  mask = b["response_mask"]
  assert np.all((w[mask] >= 0) & (w[mask] <= 1.2 + 1e-6)) and np.all(w[~mask] == 0)
  m = np.array([[1, 0, 1, 0, 1]], bool)
  ls = np.full((1, 5), -1.0, np.float32)
  lt = np.array([[-1.0, 0, -3.0, 0, -1.0]], np.float32)   # d = [0, 2, 0]
  w = call(sod.sod_step_weights, response_mask=m, logprob_old=ls, logprob_teacher=lt)
  np.testing.assert_allclose(w[0], [1.0, 0, 0.5e-6, 0, 1.0], rtol=1e-3)


def test_overflow_steps_merge_into_last():
  m = np.array([[1, 0, 1, 0, 1, 0, 1]], bool)
  ls = np.full((1, 7), -1.0, np.float32)
  lt = np.array([[-1.1, 0, -1.4, 0, -1.2, 0, -1.6]], np.float32)  # d = [.1, .4, .2, .6]
  w = call(sod.sod_step_weights, response_mask=m, logprob_old=ls, logprob_teacher=lt,
           num_steps=3)[0]
  # steps 3 and 4 form one step with d = mean(.2, .6) = .4.
  np.testing.assert_allclose(w[[0, 2, 4, 6]], [1.0, 0.25, 0.25, 0.25], rtol=1e-4)


def test_extreme_teacher_logprobs_are_clamped():
  a = call(sod.sod_advantages, reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
                         response_mask=np.ones((2, 2), bool),
                         logprob_old=np.full((2, 2), -1.0, np.float32),
                         logprob_teacher=np.array([[-np.inf, -1.0], [-1e9, -1.0]], np.float32),
                         num_groups=1, group_std="none")
  np.testing.assert_allclose(np.asarray(a), [[0.5 - 19.0, 0.5], [-0.5 - 19.0, -0.5]], rtol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mode="legacy"), "mode"), (dict(num_steps=0), "num_steps"),
    (dict(group_std="sample"), "group_std"), (dict(group_size=3), "multiple"),
])
def test_bad_static_args_raise(kwargs, match):
  b = make_batch(0)
  with pytest.raises(ValueError, match=match):
    call(sod.sod_advantages, **pick(b, *FIELDS), num_groups=N, **kwargs)


def test_shape_mismatch_raises():
  b = make_batch(0)
  with pytest.raises(AssertionError):
    call(sod.sod_advantages, **dict(pick(b, *FIELDS), logprob_teacher=np.zeros((B, T + 1))),
         num_groups=N)


@pytest.mark.parametrize("num_steps", [1, 2, 3, 16])
def test_block_step_means_equal_the_per_token_sums(num_steps):
  # Blocks of one step are summed whole, the others token by token: same means as the
  # per-token segment sums (to float32 rounding), on masks with many short runs.
  import jax
  rng = np.random.default_rng(num_steps)
  for t in (16, 37, 70):
    mask = rng.random((5, t)) < rng.choice([0.3, 0.7, 0.95], (5, 1))
    mask[0] = False
    x = rng.uniform(0, 3, (5, t)).astype(np.float32)
    sid = _steps.steps_from_mask(mask, num_steps)
    got = jax.jit(sod._ordered_step_means, static_argnums=2)(x, sid, num_steps)
    want, _ = _steps.step_means(x, sid, num_steps)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
