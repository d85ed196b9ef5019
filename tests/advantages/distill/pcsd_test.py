"""PCSD (credit/advantages/distill/pcsd.py).

Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import pcsd
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_steps import (B, G, N, T, call, make_batch, pick,
                                                 ref_pcsd, ref_pcsd_parts)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher", "step_id")
S = np.array([[0.4, 0.2, -0.1, -0.3, 0.5]], np.float32)
CONFIGS = {
    "default": dict(),
    "fast_window5": dict(group_size=G, window=5, decay=0.8, beta=0.5),
    "window1_sharp": dict(window=1, kappa=10.0, tau=0.1, eta=0.0),
}


CASES = table(pcsd.pcsd_advantages, FIELDS, ref_pcsd, CONFIGS, batch=make_batch, num_groups=N, seeds=(0,),
              default_seeds=(0, 1), rtol=1e-4, atol=1e-5)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("pcsd")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(pcsd, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  out = call(pcsd.pcsd_persistence, response_mask=np.ones((1, 5), bool),
             logprob_old=np.full((1, 5), -2.0, np.float32), logprob_teacher=S - 2.0,
             step_id=np.zeros((1, 5), np.int32))
  np.testing.assert_allclose(out.support[0], S[0], atol=1e-5)
  np.testing.assert_allclose(out.aggregate[0], [0.4, 0.266667, 0.057143, -0.171429, 0.185714],
                             atol=1e-5)
  np.testing.assert_allclose(out.modulated[0], [0.4, 0.133333, -0.152381, -0.4, 0.185714],
                             atol=1e-5)
  np.testing.assert_allclose(out.weight[0], [0.880797, 0.660756, 0.318233, 0.119203, 0.716785],
                             atol=1e-5)


def test_windows_do_not_cross_steps_or_masked_tokens():
  # A step change at t=2 and a masked token at t=5 restart the window (P = s, Δ = 0 there).
  s = np.array([[0.4, 0.2, -0.1, -0.3, 0.5, 9.0, 0.3]], np.float32)
  out = call(pcsd.pcsd_persistence, response_mask=np.array([[1, 1, 1, 1, 1, 0, 1]], bool),
             logprob_old=np.full((1, 7), -2.0, np.float32), logprob_teacher=s - 2.0,
             step_id=np.array([[0, 0, 1, 1, 1, 1, 1]], np.int32))
  p = out.aggregate[0]
  np.testing.assert_allclose(p[[0, 2, 6]], s[0, [0, 2, 6]], atol=1e-6)
  np.testing.assert_allclose(p[3], (-0.3 + 0.5 * -0.1) / 1.5, atol=1e-6)
  np.testing.assert_allclose(out.modulated[0, [2, 6]], p[[2, 6]], atol=1e-6)
  assert out.weight[0, 5] == 0.0 and p[5] == 0.0


def test_persistence_matches_reference_parts():
  b = make_batch(2)
  out = call(pcsd.pcsd_persistence, **pick(b, "response_mask", "logprob_old",
                                           "logprob_teacher", "step_id"))
  for i in range(B):
    for t, (s, p, pt, w) in ref_pcsd_parts(b, i).items():
      np.testing.assert_allclose([out.support[i, t], out.aggregate[i, t], out.modulated[i, t],
                                  out.weight[i, t]], [s, p, pt, w], rtol=1e-4, atol=1e-5)


def test_teacher_equal_student_gives_grpo_and_weights_in_unit_interval():
  b = make_batch(3, extreme=False)
  kw = dict(pick(b, *FIELDS), logprob_teacher=b["logprob_old"])
  grpo = call(grpo_advantages, **pick(b, "reward", "group_id", "response_mask"), num_groups=N)
  np.testing.assert_allclose(np.asarray(run(CASE["default"], kw)), grpo, rtol=1e-6, atol=1e-7)
  out = call(pcsd.pcsd_persistence, **pick(b, "response_mask", "logprob_old",
                                           "logprob_teacher", "step_id"))
  w = out.weight[b["response_mask"]]
  assert np.all((w >= 0) & (w <= 1))


@pytest.mark.parametrize("kwargs,match", [
    (dict(window=0), "window"), (dict(group_std="sample"), "group_std"),
    (dict(group_size=3), "multiple"),
])
def test_bad_static_args_raise(kwargs, match):
  b = make_batch(0)
  with pytest.raises(ValueError, match=match):
    call(pcsd.pcsd_advantages, **pick(b, *FIELDS), num_groups=N, **kwargs)


def test_shape_mismatch_raises():
  b = make_batch(0)
  with pytest.raises(AssertionError):
    call(pcsd.pcsd_advantages, **dict(pick(b, *FIELDS), step_id=np.zeros((B, T + 1), np.int32)),
         num_groups=N)
