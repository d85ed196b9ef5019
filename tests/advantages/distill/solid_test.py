"""SOLID (credit/advantages/distill/solid.py)."""
from __future__ import annotations

import doctest
import functools

import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.distill import solid
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_teach import (B, G, N, T, batch, pick, ref_solid,
                                                 ref_solid_labels)

FIELDS = ("answer_value", "group_id", "response_mask", "logprob_old", "logprob_teacher")
CONFIGS = {
    "default": dict(),
    "loose": dict(tol=0.6, min_support=3, coef=0.5),
    "fast": dict(group_size=G),
}


CASES = table(solid.solid_advantages, FIELDS, ref_solid, CONFIGS)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


@functools.lru_cache(maxsize=None)
def jitted_labels(name):
  kw = {k: v for k, v in CONFIGS[name].items() if k in ("tol", "min_support", "group_size")}
  return jax.jit(functools.partial(solid.solid_pseudo_labels, num_groups=N, **kw))


def test_registered():
  spec = registry.get_estimator("solid")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS) and "reward" not in spec.params


def test_doctests():
  res = doctest.testmod(solid, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  o = np.array([10., 10.0000001, 12., np.nan, 10.], np.float32)
  kw = dict(answer_value=o, group_id=np.zeros(5, np.int32), response_mask=np.ones((5, 2), bool),
            num_groups=1)
  lab = solid.solid_pseudo_labels(**kw)
  assert np.asarray(lab.support).tolist() == [3, 3, 1, 0, 3]
  assert np.asarray(lab.label).tolist() == [1, 1, 0, 0, 1]
  lt = np.array([[0., 0.], [0., 0.], [-0.5, 1.0], [-1.0, -np.inf], [0., 0.]], np.float32)
  a = np.asarray(solid.solid_advantages(**kw, logprob_old=np.zeros((5, 2), np.float32),
                                        logprob_teacher=lt))
  grpo = np.array([0.730295, 0.730295, -1.095443, -1.095443, 0.730295])
  np.testing.assert_allclose(a, grpo[:, None] + np.where(lab.label[:, None] > 0, 0.0,
                                                         np.maximum(lt, -20.0)), atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_pseudo_labels_match_numpy_reference(name, seed):
  cfg = dict(CONFIGS[name])
  b = batch(seed, contiguous="group_size" in cfg)
  kw = {k: cfg[k] for k in ("tol", "min_support", "group_size") if k in cfg}
  lab = jitted_labels(name)(**pick(b, *FIELDS[:3]))
  label, support, majority = ref_solid_labels(b, **kw)
  np.testing.assert_array_equal(np.asarray(lab.label), label)
  np.testing.assert_array_equal(np.asarray(lab.support), support)
  np.testing.assert_array_equal(np.asarray(lab.majority), majority)


def test_tied_clusters_and_no_majority_give_zero():
  kw = dict(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 1), bool), num_groups=1)
  labels = jax.jit(solid.solid_pseudo_labels, static_argnames="num_groups")
  lab = labels(answer_value=np.array([5., 2., 2., 5.], np.float32), **kw)
  # Two clusters of equal support: no majority (the lowest-index tie-break would make
  # the labels depend on the row order).
  assert not np.asarray(lab.majority).any() and not np.asarray(lab.label).any()
  lab = labels(answer_value=np.array([5., 2., 2., 2.], np.float32), **kw)
  assert np.asarray(lab.label).tolist() == [0, 1, 1, 1] and np.asarray(lab.majority).all()
  z = np.zeros((4, 1), np.float32)
  fn = jax.jit(solid.solid_advantages, static_argnames="num_groups")
  for o in ([1., 2., 3., 4.], [np.nan] * 4, [5., 2., 2., 5.]):   # support 1 < 2, all failed, tie
    a = fn(answer_value=np.array(o, np.float32), logprob_old=z, logprob_teacher=z - 1.0, **kw)
    assert np.all(np.asarray(a) == 0.0)


def test_ignores_reward_and_teacher_equal_to_student_is_grpo_of_labels():
  b = batch(2, contiguous=True)
  same = dict(pick(b, *FIELDS), logprob_teacher=b["logprob_old"])
  a = np.asarray(run(CASE["fast"], same))
  label, _, _ = ref_solid_labels(b, group_size=G)
  # Correct rows (y = 1) never get the teacher term.
  a2 = np.asarray(run(CASE["fast"], b))
  on = (label > 0)[:, None] & b["response_mask"]
  np.testing.assert_allclose(a2[on], a[on], rtol=1e-6, atol=1e-7)


def test_bad_shape_raises():
  b = batch(3)
  with pytest.raises(AssertionError):
    solid.solid_advantages(**dict(pick(b, *FIELDS), answer_value=np.zeros(B + 1, np.float32)),
                           num_groups=N)
  with pytest.raises(AssertionError):
    solid.solid_advantages(**dict(pick(b, *FIELDS), logprob_old=np.zeros((B, T + 1))),
                           num_groups=N)
