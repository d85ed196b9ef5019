"""The group filter as an extension (`experiments/extensions/group_filter.py`): its switch,
its checks, its stage right after the reward and the step it skips. Which groups it keeps,
end to end, is `tests/experiments/group_filter_test.py`."""
import importlib
import types

import numpy as np
import pytest

from experiments import extensions, producers
from experiments.extensions import group_filter


def _config(**filt):
  c = importlib.import_module("experiments.configs.grpo_arithmetic").get_config("tiny")
  c.group_filter.update(filt)
  return c


def test_on_by_any_of_its_three_settings():
  assert not group_filter.on(_config())
  assert group_filter.on(_config(min_accuracy=0.2))
  assert group_filter.on(_config(max_accuracy=0.8))
  assert group_filter.on(_config(drop_uniform=True))
  assert group_filter.EXTENSION.on is group_filter.on


@pytest.mark.parametrize("filt,match", [
    (dict(min_accuracy=0.9, max_accuracy=0.1), "min_accuracy <= max_accuracy"),
    (dict(min_accuracy=-0.1), "0 <= min_accuracy"),
])
def test_bad_bounds_refused_even_when_off(filt, match):
  with pytest.raises(producers.SetupError, match=match):
    group_filter.check(_config(**filt))


def test_refused_with_rows_it_does_not_filter():
  c = importlib.import_module("experiments.configs.jolt_arithmetic").get_config("tiny")
  c.group_filter.drop_uniform = True
  with pytest.raises(producers.SetupError, match="JOLT's teacher-role rows"):
    group_filter.check(c)


def test_skip_when_no_response_token_is_left():
  mask = np.zeros((4, 6), bool)
  batch = {"host": {"response_mask": mask}}
  assert group_filter.nothing_kept(batch, None)
  mask[2, 3] = True
  assert not group_filter.nothing_kept(batch, None)


def test_built_stage_goes_right_after_the_reward_and_the_skip_hook_is_set():
  s = types.SimpleNamespace(c=_config(drop_uniform=True), mesh=None)
  built = group_filter.build(s, None)
  (placed,) = built.stages
  assert placed.after == "reward" and placed.stage.name == group_filter.NAME
  assert placed.stage.wanted == frozenset({"response_mask"})
  assert built.skip is group_filter.nothing_kept and built.rows is None and not built.terms
  before = [producers.Stage("rollout", "sampling", frozenset({"tokens"}), None),
            producers.Stage("verifier", "reward", frozenset({"reward"}), None),
            producers.Stage("reference_pass", "scoring", frozenset({"logprob_ref"}), None)]
  after = extensions.place(before, placed, group_filter.NAME)
  assert [st.name for st in after] == ["rollout", "verifier", group_filter.NAME,
                                       "reference_pass"]
