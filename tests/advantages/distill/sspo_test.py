"""SSPO (credit/advantages/distill/sspo.py).

Registry-wide properties live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.distill import sspo
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_steps import (B, G, N, T, call, make_batch, pick,
                                                 ref_sspo)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher", "step_id")
CONFIGS = {
    "default": dict(),
    "fast_two_steps": dict(group_size=G, num_steps=2),
    "noclip_population": dict(omega_max=np.inf, group_std="population"),
}


CASES = table(sspo.sspo_advantages, FIELDS, ref_sspo, CONFIGS, batch=make_batch, num_groups=N, seeds=(0,),
              default_seeds=(0, 1), rtol=1e-4, atol=1e-5)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("sspo")
  assert spec.family == "distill" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(sspo, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  # rewards [1,0,0] → Â = [1.154699, −0.577349, −0.577349]; D = [.1,.5,.3] on the failed row.
  a = call(sspo.sspo_advantages, reward=np.array([1.0, 0.0, 0.0]),
           group_id=np.zeros(3, np.int32), response_mask=np.ones((3, 3), bool),
           logprob_old=np.full((3, 3), -1.0, np.float32),
           logprob_teacher=np.array([[-1.1, -1.5, -1.3]] * 3, np.float32),
           step_id=np.array([[0, 1, 2]] * 3, np.int32), num_groups=1)
  np.testing.assert_allclose(a[0], [1.154699] * 3, atol=1e-5)
  np.testing.assert_allclose(a[1], [-0.192450, -0.962249, -0.577349], atol=1e-5)


def test_sign_kept_correct_rows_untouched_mean_one():
  b = make_batch(4, equal_group=False)
  grpo = call(grpo_advantages, **pick(b, "reward", "group_id", "response_mask"), num_groups=N)
  a = np.asarray(run(CASE["default"], b))
  assert np.all(np.sign(a) * np.sign(grpo) >= 0)                # sign never flips
  correct = b["reward"] >= 1.0
  np.testing.assert_allclose(a[correct], grpo[correct], rtol=1e-6)
  # Without the clip, ω has mean 1 over each row's steps.
  w = call(sspo.sspo_step_weights, **pick(b, "response_mask", "logprob_old", "logprob_teacher",
                                          "step_id"), omega_max=np.inf)
  for i in range(B):
    steps = {int(s) for s in b["step_id"][i][b["response_mask"][i]]}
    if steps:
      per_step = [w[i][b["response_mask"][i] & (b["step_id"][i] == s)][0] for s in steps]
      np.testing.assert_allclose(np.mean(per_step), 1.0, rtol=1e-5)


def test_equal_logprobs_give_grpo():
  b = make_batch(5, extreme=False)
  kw = dict(pick(b, *FIELDS), logprob_teacher=b["logprob_old"])   # Σ D = 0 → ω = 1
  grpo = call(grpo_advantages, **pick(b, "reward", "group_id", "response_mask"), num_groups=N)
  np.testing.assert_allclose(call(sspo.sspo_advantages, num_groups=N, **kw), grpo, rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_steps=0), "num_steps"), (dict(group_std="sample"), "group_std"),
    (dict(group_size=3), "multiple"),
])
def test_bad_static_args_raise(kwargs, match):
  b = make_batch(0)
  with pytest.raises(ValueError, match=match):
    call(sspo.sspo_advantages, **pick(b, *FIELDS), num_groups=N, **kwargs)


def test_shape_mismatch_raises():
  b = make_batch(0)
  with pytest.raises(AssertionError):
    call(sspo.sspo_advantages, **dict(pick(b, *FIELDS), step_id=np.zeros((B, T + 1), np.int32)),
         num_groups=N)
