"""The group filter (experiments/extensions/group_filter.py): which groups it keeps, how it
empties the dropped groups' rows for everything after the reward, and the step it skips when
none is left."""
import importlib

import jax
import numpy as np
import pytest

from credit import parallel
from experiments import loop, producers
from experiments.extensions import group_filter


def test_kept_rows_by_accuracy_band_and_uniform_rewards():
  # Groups of 4: accuracies 0, 0.5, 1 and 0.25; row 15 is invalid (no response token).
  reward = np.array([0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1], np.float32)
  gid = np.repeat(np.arange(4), 4)
  valid = np.ones(16, bool)
  valid[15] = False
  band = group_filter.kept_rows(reward, gid, valid, min_accuracy=0.2, max_accuracy=0.8,
                                drop_uniform=False, success_threshold=1.0)
  np.testing.assert_array_equal(band, np.isin(gid, [1, 3]) & valid)  # group 3: 1 of 3 valid
  uniform = group_filter.kept_rows(reward, gid, valid, min_accuracy=0.0, max_accuracy=1.0,
                                   drop_uniform=True, success_threshold=1.0)
  np.testing.assert_array_equal(uniform, np.isin(gid, [1, 3]) & valid)
  # Non-binary rewards: equal values are uniform even below the success threshold.
  soft = group_filter.kept_rows(np.array([0.3, 0.3, 0.2, 0.3]), np.array([0, 0, 1, 1]),
                                np.ones(4, bool), min_accuracy=0.0, max_accuracy=1.0,
                                drop_uniform=True, success_threshold=1.0)
  np.testing.assert_array_equal(soft, [False, False, True, True])


def _tiny(**filt):
  c = importlib.import_module("experiments.configs.grpo_arithmetic").get_config("tiny")
  c.mesh, c.sft_steps = "data=1", 0  # an untrained policy: every reward is 0
  c.group_filter.update(filt)
  return c


@pytest.mark.parametrize("filt,match", [
    (dict(min_accuracy=0.9, max_accuracy=0.1), "min_accuracy <= max_accuracy"),
    (dict(max_accuracy=1.5), "max_accuracy <= 1"),
])
def test_bad_settings_are_refused_before_any_file(filt, match, tmp_path):
  with pytest.raises(producers.SetupError, match=match):
    loop.setup(_tiny(**filt), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_dropped_groups_reach_nothing_after_the_reward_and_an_empty_step_is_skipped(tmp_path):
  run, rs = loop.setup(_tiny(drop_uniform=True), str(tmp_path))
  names = [st.name for st in run.stages]
  assert names[names.index(group_filter.NAME) - 1] in ("verifier",)  # right after the reward
  ctx = loop._context(run, rs)
  batch, times = {}, {}
  loop.run_stages(run.stages, rs.train, batch, ctx, times)
  reward = parallel.to_host(batch["reward"])
  assert not reward.any()  # untrained: every group is uniform (all 0) and dropped
  assert not np.asarray(parallel.to_host(batch["response_mask"])).any()
  assert not batch["host"]["response_mask"].any() and batch["host"]["sampled_response_mask"].any()
  assert ctx.metrics["group_kept_frac"] == 0.0
  before = jax.tree.map(np.asarray, rs.train.params)
  rs2, metrics = loop.learn(run, rs, ctx, batch, times, 0.0)
  assert metrics["update_skipped"] == 1.0 and rs2.step == rs.step + 1
  assert metrics["response_length"] > 0  # of the sampled rows, not the kept ones
  jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, rs2.train.params))
  # The same run with a band that keeps every group (accuracy 0 <= 0.5): a normal update.
  run.c.group_filter.update(dict(drop_uniform=False, max_accuracy=0.5))
  stages = [group_filter.build_stage(run.setup) if st.name == group_filter.NAME else st
            for st in run.stages]
  ctx, batch = loop._context(run, rs2), {}
  loop.run_stages(stages, rs2.train, batch, ctx, times)
  assert ctx.metrics["group_kept_frac"] == 1.0
  np.testing.assert_array_equal(batch["host"]["response_mask"], batch["host"]["sampled_response_mask"])
  _, metrics = loop.learn(run, rs2, ctx, batch, times, 0.0)
  assert "update_skipped" not in metrics and np.isfinite(metrics["loss"])
