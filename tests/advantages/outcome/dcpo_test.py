"""DCPO smooth advantage standardisation (credit/advantages/outcome/dcpo.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from credit import registry
from credit.advantages.outcome import DCPOState, dcpo_advantages, dcpo_init_state
from tests.advantages.outcome._harness import (B, BASE, Case, ONE_GROUP, assert_close, bt,
                                               fixed_batch, reference_test, row0, run, valid_groups)


def ref_dcpo(b, old_stats_ratio=1.0, scale=True):
  r = b["reward"].astype(np.float64)
  st0 = b["state"]
  count = np.asarray(st0.count).astype(np.int64).copy()
  mean = np.asarray(st0.mean).astype(np.float64).copy()
  std = np.asarray(st0.std).astype(np.float64).copy()
  _, groups = valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    pid = int(b["prompt_id"][rows[0]])
    n, mp, sp = count[pid], mean[pid] * old_stats_ratio, std[pid] * old_stats_ratio
    x = r[rows]
    mu_new, sd_new = x.mean(), (x.std(ddof=1) if len(rows) > 1 else 0.0)
    if n == 0:
      mu, sd = mu_new, sd_new
    else:
      mu = (n * mp + mu_new) / (n + 1)
      sd = math.sqrt((n * sp**2 + sd_new**2 + n / (n + 1) * (mu_new - mp) ** 2) / (n + 1))
    if scale:
      a_new = (x - mu_new) / sd_new if sd_new > 0 else np.zeros_like(x)
      a_tot = (x - mu) / sd if sd > 0 else np.zeros_like(x)
    else:
      a_new, a_tot = x - mu_new, x - mu
    i = n + 1
    s1 = (i - 1) / i * a_new + a_tot / i
    s2 = a_new / i + (i - 1) / i * a_tot
    out[rows] = np.where(np.abs(s1) < np.abs(s2), s1, s2)
    count[pid], mean[pid], std[pid] = n + 1, mu, sd
  return (bt(out, b), count, mean, std)


DCPO = BASE + ("prompt_id", "state")
CASES = [
    Case("dcpo", "dcpo", DCPO, ref_dcpo),
    Case("dcpo_ratio_noscale", "dcpo", DCPO, ref_dcpo,
         (("old_stats_ratio", 0.8), ("scale", False))),
]


test_matches_numpy_reference = reference_test(CASES)


@pytest.mark.parametrize("rewards,n,expected,new_mean,new_std", [
    ([1, 1, 1, 1], 2, [0.235702] * 4, 0.666667, 0.471405),
    ([1, 0, 0, 0], 2, [1.257033, -0.603702, -0.603702, -0.603702], 0.416667, 0.513701),
    ([1, 0, 0, 0], 0, [1.5, -0.5, -0.5, -0.5], 0.25, 0.5),
])
def test_spec_example(rewards, n, expected, new_mean, new_std):
  # §8.6: state n, μ_prev = 0.5, σ_prev = 0.5 in prompt slot 1.
  state = dcpo_init_state(3)
  state = state._replace(count=state.count.at[1].set(n), mean=state.mean.at[1].set(0.5),
                         std=state.std.at[1].set(0.5))
  out = dcpo_advantages(reward=np.array(rewards, np.float32), prompt_id=np.ones(4, np.int32),
                        state=state, **ONE_GROUP)
  np.testing.assert_allclose(row0(out.advantages), expected, atol=1e-5)
  assert np.asarray(out.state.count).tolist() == [0, n + 1, 0]
  np.testing.assert_allclose(np.asarray(out.state.mean), [0, new_mean, 0], atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.state.std), [0, new_std, 0], atol=1e-5)


def test_state_threads_over_steps():
  case = CASES[0]
  b1 = fixed_batch(seed=31)
  b1["state"] = dcpo_init_state(len(b1["state"].count))
  out1 = run(case, b1)
  assert_close(out1, case.reference(b1))
  b2 = fixed_batch(seed=32)
  b2["state"] = DCPOState(*(np.asarray(x) for x in out1[1:]))
  assert_close(run(case, b2), case.reference(b2))
  # Second appearance of an all-equal group: (1/i)·A_tot, not 0.
  b3 = dict(b2, reward=np.full(B, 0.25, np.float32))
  assert np.any(run(case, b3)[0] != 0.0)


def test_registered_with_its_state():
  spec = registry.get_estimator("dcpo")
  assert spec.stateful and spec.returns_output and spec.init_state is dcpo_init_state
  with pytest.raises(ValueError, match="num_prompts"):
    dcpo_init_state(0)
