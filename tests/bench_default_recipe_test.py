"""benchmarks/default_recipe.py: the seed table's rows, mean / min / max and control column, and
the refusal to read back a finished run made with other settings (no run is started)."""
import json
import os

import pytest

from benchmarks import default_recipe


def _row(seed, evals, wall=300.0, cpu=420.0, load=2.0):
  return {"seed": seed, "evals": evals, "wall_s": wall, "cpu_s": cpu, "load": load}


def test_table_has_one_line_per_seed_then_mean_min_max():
  rows = [_row(0, {0: 0.5, 25: 0.9, 200: 0.95}), _row(1, {0: 0.4, 25: 0.6, 200: 0.8}, wall=360.0)]
  controls = {0: _row(0, {0: 0.48})}  # seed 1 has no control: "-" there, left out of the mean
  lines = default_recipe.table(rows, controls).splitlines()
  assert lines[0].split(" | ")[1:4] == ["after warm-up (step 0)", "step 25", "step 200"]
  assert lines[2].startswith("| 0 | 0.500 | 0.900 | 0.950 | +0.450 | 5 min 00 s | 7.0 min |")
  assert lines[3].endswith("| 2.0 | - |")
  mean, lo, hi = lines[4:7]
  assert mean.startswith("| mean | 0.450 | 0.750 | 0.875 | **+0.425** | 5 min 30 s |")
  assert mean.endswith("| 0.480 |")
  assert lo.startswith("| min | 0.400 |") and "+0.400" in lo
  assert hi.startswith("| max | 0.500 |") and "+0.450" in hi


def test_a_finished_run_with_other_settings_is_refused(tmp_path):
  wd = tmp_path / "default" / "seed0"
  os.makedirs(wd)
  with open(wd / "bench.json", "w") as f:
    json.dump({"xla_flags": "", "control": False, "overrides": ["steps=5"],
               "evals": {"0": 0.5, "5": 0.6}}, f)
  got = default_recipe.run_one(workdir=str(wd), seed=0, xla_flags="", control=False,
                               overrides=["steps=5"])
  assert got["evals"] == {0: 0.5, 5: 0.6}
  with pytest.raises(SystemExit, match="holds a run with other settings"):
    default_recipe.run_one(workdir=str(wd), seed=0, xla_flags="", control=False, overrides=[])
