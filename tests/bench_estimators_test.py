"""benchmarks/estimators.py cannot rot: its quick mode runs every registered estimator once in
each benchmarked setting at a tiny size, and every one gives finite [B,T] advantages."""
import math

import numpy as np

from benchmarks import estimators
from credit import registry


def test_quick_mode_measures_every_registered_estimator():
  lines = []
  rows = estimators.run(**estimators.QUICK, repeats=1, quick=True, out=lines.append)
  errors = [f"{r.name}/{r.path}: {r.error}" for r in rows if r.error]
  assert not errors, "\n".join(errors)
  assert {r.name for r in rows} == set(registry.list_estimators())
  for name, configs in estimators.EXTRA_CONFIGS.items():
    paths = {r.path for r in rows if r.name == name}
    assert all(any(p.endswith(label) for p in paths) for label, _ in configs), (name, paths)
  assert all(math.isfinite(r.cpu) and r.cpu > 0 for r in rows)
  assert any(line.startswith("estimators measured: ") for line in lines)
  assert lines[-1] == "errors: none"


def test_bench_fields_follow_the_contract_and_the_layout():
  fields = estimators.BenchFields(batch=8, seq=16, group=4, steps=4)
  for name, field in estimators.credit.CONTRACT.items():
    x = fields[name]
    assert x.shape == tuple(fields.dims[c] for c in field.shape), name
  mask, turn = fields["response_mask"], fields["turn_id"]
  assert (mask.sum(1) >= 4).all()                      # lengths in [T/4, T]
  np.testing.assert_array_equal(turn >= 0, mask)
  assert set(np.unique(turn[mask])) <= set(range(4))
  np.testing.assert_array_equal(fields["group_id"], np.arange(8) // 4)
  assert fields["step_mask"].shape == (8, 4)


def test_bench_fields_do_not_depend_on_the_order_they_are_made():
  a = estimators.BenchFields(batch=8, seq=16, group=4, steps=4)
  b = estimators.BenchFields(batch=8, seq=16, group=4, steps=4)
  names = ["logprob", "turn_id", "entropy", "step_mask"]
  got_a = {n: a[n] for n in names}
  got_b = {n: b[n] for n in reversed(names)}
  for n in names:
    np.testing.assert_array_equal(got_a[n], got_b[n])
