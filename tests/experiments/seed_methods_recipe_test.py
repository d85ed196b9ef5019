"""The seed-paper estimators for text (satisdive, novelty_search, serene, vigil, opac, rewam)
run by name on an existing recipe: `grpo_arithmetic:tiny` with `--config.estimator=<name>`,
two RL steps with every batch validated. The stateful ones keep their per-prompt archive
between steps; the `logprob_alt` of vigil and rewam comes from the existing alt-context
re-scoring pass."""
import numpy as np
import pytest

from experiments import loop
from tests.experiments.runner_test import METHOD_RUN, read_metrics, tiny


@pytest.mark.parametrize("estimator,producer", [
    ("satisdive", None),
    ("novelty_search", None),
    ("serene", None),
    ("vigil", "alt_context_pass"),
    ("opac", None),
    ("rewam", "alt_context_pass"),
])
def test_runs_by_name_on_the_tiny_recipe(estimator, producer, tmp_path):
  c = tiny(estimator=estimator, debug_checks=True, steps=2, **METHOD_RUN)
  plan = [p.producer.name for p in loop.check_method(c).plan]
  if producer:
    assert producer in plan, plan
  wd = str(tmp_path / estimator)
  loop.run(c, wd)
  last = read_metrics(wd)[-1]
  assert last["step"] == 2 and np.isfinite(last["loss"]) and np.isfinite(last["adv_abs_mean"])
