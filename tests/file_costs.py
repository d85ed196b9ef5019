"""Rewrites tests/file_costs.json (seconds per test file, the order the suite runs them in)
from the per-test timings of one run: `CREDIT_TEST_TIMES=/tmp/t make test` with a fresh
directory (workers append to its files), then `python -m tests.file_costs /tmp/t`."""
import collections
import glob
import json
import os
import sys


def main(times_dir: str) -> None:
  last = {}
  # main.tsv is the xdist controller's: every report, notebooks included (the workers' files
  # miss the notebook items, which this directory's conftest does not see).
  paths = [os.path.join(times_dir, "main.tsv")]
  if not os.path.exists(paths[0]):
    paths = sorted(glob.glob(os.path.join(times_dir, "gw*.tsv")))
  for path in paths:
    with open(path, encoding="utf-8") as f:
      for line in f:
        seconds, phase, nodeid = line.rstrip("\n").split("\t")
        last[(phase, nodeid)] = float(seconds)
  cost = collections.Counter()
  for (_, nodeid), seconds in last.items():
    cost[nodeid.split("::")[0]] += seconds
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_costs.json")
  with open(out, "w", encoding="utf-8") as f:
    json.dump({k: round(v, 1) for k, v in cost.most_common()}, f, indent=0)
    f.write("\n")
  print(f"{len(cost)} files, {sum(cost.values()):.0f} s in all -> {out}")


if __name__ == "__main__":
  main(sys.argv[1])
