"""Memory-R2 LoGo-GRPO (credit/advantages/turn/logo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import logo
from tests.advantages.turn._ref import zscore_cells
from tests.contract_fields import N, make_fields, mixed_layout


def ref_logo(b, local_coef=1.0):
  row = b["response_mask"].any(1)
  par = b["parent_id"]
  B = len(par)
  keys = [[("g", int(b["group_id"][i])) if par[i] < 0 else
           (("p", int(par[i])) if par[i] < B else None)] for i in range(B)]
  a = zscore_cells(b["reward"][:, None], row[:, None], keys, ddof=1)[:, 0]
  a = np.where(par < 0, a, local_coef * a)
  return np.where(b["response_mask"], a[:, None], 0.0)


def test_registered():
  assert registry.get_estimator("logo").confidence == "inferred"


def test_spec_example():
  # Rows 3, 4 are full trajectories [1, 0]; rows 0-2 re-roll from row 3's saved state with
  # rewards [1, 0, 1]; row 5 is the only surviving child of row 4 (-> 0).
  a = logo.logo_advantages(reward=np.array([1., 0., 1., 1., 0., 5.], np.float32),
                           group_id=np.zeros(6, np.int32),
                           parent_id=np.array([3, 3, 3, -1, -1, 4]),
                           response_mask=np.ones((6, 1), bool), num_groups=1)
  np.testing.assert_allclose(a[:, 0], [0.577349, -1.154699, 0.577349, 0.707106, -0.707106, 0.0],
                             atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("coef", [1.0, 0.5])
def test_matches_numpy_reference(seed, coef):
  reward, lengths, gid = mixed_layout(seed)
  b = make_fields(seed, reward=reward, lengths=lengths, group_id=gid)
  rng = np.random.default_rng(seed)
  b["parent_id"] = rng.choice([-1, -1, 2, 3, 20], len(reward)).astype(np.int32)
  got = logo.logo_advantages(reward=b["reward"], group_id=b["group_id"],
                             parent_id=b["parent_id"], response_mask=b["response_mask"],
                             num_groups=N, local_coef=coef)
  np.testing.assert_allclose(got, ref_logo(b, coef), atol=1e-4)
