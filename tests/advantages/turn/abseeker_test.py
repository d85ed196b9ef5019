"""ABSeeker ABC-GRPO / ABC-SFT (credit/advantages/turn/abseeker.py)."""
from __future__ import annotations

import doctest

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import abseeker as ab
from tests.advantages.turn._ref import pooled_keys, scatter, zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout

NEEDS = registry.get_estimator("abseeker").needs


def batch(seed):
  reward, lengths, gid = mixed_layout(seed)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, holes=True)


def ref_abseeker(b, outcome_coef=1.0):
  valid = b["step_mask"] & b["response_mask"].any(1)[:, None]
  rho = np.where(valid, b["step_reward"], 0.0).astype(np.float64)
  for i in range(rho.shape[0]):
    ks = np.flatnonzero(valid[i])
    if len(ks):
      rho[i, ks[-1]] += outcome_coef * b["reward"][i]
  a = zscore_cells(rho, valid, pooled_keys(b["group_id"], rho.shape[1]), ddof=1)
  return scatter(a, b["turn_id"], b["response_mask"])


def test_registered_and_doctest():
  assert registry.get_estimator("abseeker").confidence == "inferred"
  assert doctest.testmod(ab).failed == 0


def test_spec_example_sft_weights():
  w = ab.abseeker_sft_weights(step_reward=np.array([[1., 0., .5], [0., 0., 0.]], np.float32),
                              step_mask=np.ones((2, 3), bool), turn_id=np.array([[0, 1, 2]] * 2),
                              response_mask=np.ones((2, 3), bool))
  np.testing.assert_allclose(w, [[2., 0., 1.], [1., 1., 1.]], atol=1e-6)


def test_worked_example():
  # One group, two rows of two steps: scores [[1, .5], [0, .5]], outcome [1, 0] ->
  # ρ = [[1, 1.5], [0, .5]], μ = .75, σ (unbiased) = .645497.
  a = ab.abseeker_advantages(reward=np.array([1., 0.], np.float32),
                             step_reward=np.array([[1., .5], [0., .5]], np.float32),
                             step_mask=np.ones((2, 2), bool), turn_id=np.array([[0, 1]] * 2),
                             group_id=np.array([0, 0]), response_mask=np.ones((2, 2), bool),
                             num_groups=1)
  np.testing.assert_allclose(a, [[0.387298, 1.161895], [-1.161895, -0.387298]], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("coef", [1.0, 0.5])
def test_matches_numpy_reference(seed, coef):
  b = batch(seed)
  got = ab.abseeker_advantages(**{k: b[k] for k in NEEDS}, num_groups=N, outcome_coef=coef)
  np.testing.assert_allclose(got, ref_abseeker(b, coef), atol=1e-4)
