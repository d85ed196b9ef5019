"""HyperEyes (credit/advantages/distill/hypereyes.py); the authors' code's behaviour is the
default."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages import diffgate_advantages, grpo_advantages
from credit.advantages.distill import hypereyes as he
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_teach import (B, G, N, batch, pick, ref_hypereyes,
                                                 row_valid)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher")
CONFIGS = {
    "code": dict(),
    "paper": dict(form="paper"),
    "code_fast": dict(group_size=G, kl_coef=0.2),
}




def with_anomalies(b):
  r = b["reward"].copy()
  r[[2, 9]] = -100.0           # the code's anomaly marker
  return dict(b, reward=r)


CASES = table(he.hypereyes_advantages, FIELDS, ref_hypereyes, CONFIGS, prep=with_anomalies)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("hypereyes")
  assert spec.family == "distill" and spec.confidence == "code-verified"
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(he, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  # Paper form on A3's rollout 1 (no gating, no tanh, λ = 1): [0.000001, −2.499999].
  kw = dict(reward=np.array([1., 0., 0., 0.]), group_id=np.zeros(4, np.int32),
            response_mask=np.ones((4, 2), bool), logprob_old=np.zeros((4, 2), np.float32),
            logprob_teacher=np.array([[0., 0.], [0.5, -2.0], [0., 0.], [0., 0.]], np.float32),
            num_groups=1)
  a = np.asarray(he.hypereyes_advantages(**kw, form="paper"))
  np.testing.assert_allclose(a[1], [0.000001, -2.499999], atol=1e-5)
  # The code: β = 0.05 on rows with reward ≤ 0.
  a = np.asarray(he.hypereyes_advantages(**kw))
  np.testing.assert_allclose(a[1], [-0.499999 + 0.025, -0.499999 - 0.1], atol=1e-5)
  np.testing.assert_allclose(a[0], [1.499997, 1.499997], atol=1e-5)


def test_anomalies_are_zero_and_excluded():
  b = batch(2, contiguous=True)
  a = np.asarray(run(CASE["code_fast"], with_anomalies(b)))
  assert np.all(a[[2, 9]] == 0.0)
  # Excluding a row as an anomaly equals masking it out.
  drop = np.zeros(B, bool)
  drop[[2, 9]] = True
  masked = dict(b, response_mask=b["response_mask"] & ~drop[:, None])
  np.testing.assert_allclose(a, np.asarray(run(CASE["code_fast"], masked)),
                             rtol=1e-6, atol=1e-7)


def test_reductions():
  b = batch(3)
  kw = pick(b, *FIELDS)
  grpo = np.asarray(grpo_advantages(**pick(b, "reward", "group_id", "response_mask"),
                                    num_groups=N))
  same = dict(kw, logprob_teacher=b["logprob_old"])
  for form in ("code", "paper"):
    a = he.hypereyes_advantages(**same, num_groups=N, form=form)
    np.testing.assert_allclose(np.asarray(a), grpo, rtol=1e-6, atol=1e-6)
  # Paper form = DiffGate with d ≡ 1 and no tanh: equal where every failure's group d = 1.
  a = np.asarray(he.hypereyes_advantages(**dict(kw, reward=np.zeros(B, np.float32)),
                                         num_groups=N, form="paper"))
  d = np.asarray(diffgate_advantages(**dict(kw, reward=np.zeros(B, np.float32)), num_groups=N,
                                     bound=1e6))
  np.testing.assert_allclose(a, d, rtol=1e-4, atol=1e-5)
  # The code gates on reward ≤ 0: correct and partially correct rows get plain GRPO.
  a = np.asarray(he.hypereyes_advantages(**kw, num_groups=N))
  pos = (b["reward"] > 0) & row_valid(b)
  np.testing.assert_allclose(a[pos], grpo[pos], rtol=1e-6, atol=1e-6)


def test_bad_form_raises():
  with pytest.raises(ValueError, match="form"):
    he.hypereyes_advantages(**pick(batch(4), *FIELDS), num_groups=N, form="both")
