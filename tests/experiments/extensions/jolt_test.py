"""JOLT's teacher role as an extension (`experiments/extensions/jolt.py`): its switch, its row
set, the rows it adds to the update batch and its placement. The role's rows end to end are
`tests/experiments/jolt_runner_test.py`."""
import importlib
import types

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import extensions, producers, train
from experiments.extensions import jolt


def _config(recipe="jolt_arithmetic"):
  return importlib.import_module(f"experiments.configs.{recipe}").get_config("tiny")


def test_row_set_of_the_teacher_role():
  c = _config()
  c.jolt.loss_coef = 0.5
  (rows,) = jolt.row_sets(c)
  assert rows == train.RowSet("teacher", weight=0.5, group_size=int(c.jolt.teacher_samples),
                              metric_prefix="jolt_teacher_", loss_metric="loss_teacher")
  assert jolt.EXTENSION.main_role == "student"  # the rollout's rows report loss_student
  assert jolt.row_sets(_config("grpo_arithmetic")) == ()
  assert not jolt.on(_config("grpo_arithmetic")) and jolt.on(c)


def test_teacher_estimator_alone_is_refused():
  c = _config("grpo_arithmetic")
  c.estimator = jolt.TEACHER_ESTIMATOR
  with pytest.raises(producers.SetupError, match="JOLT's teacher role"):
    jolt.check(c)


def test_rows_hook_adds_the_teacher_rows_and_the_student_metrics():
  """The hook puts the batch's `EXTRA` under the row set's key, leaves the student rows as
  they are, and reports the student role's mean and mean |advantage| over its tokens."""
  adv = np.array([[0.0, 1.0, -3.0], [2.0, 0.0, 0.0]], np.float32)
  resp = np.array([[False, True, True], [True, False, False]])
  teacher = {"tokens": np.ones((4, 5), np.int32)}
  ctx = types.SimpleNamespace(metrics={})
  student = {"tokens": np.zeros((2, 3), np.int32)}
  step = extensions.Step(None, {"advantages": jnp.asarray(adv), "response_mask": resp,
                                jolt.EXTRA: teacher}, ctx, False)
  parts = jolt.update_batch({train.MAIN: student}, step, num_groups=1)
  assert parts[train.MAIN] is student and parts[jolt.ROLE] is teacher
  np.testing.assert_allclose(ctx.metrics["jolt_student_adv_mean"], (1 - 3 + 2) / 3)
  np.testing.assert_allclose(ctx.metrics["jolt_student_adv_abs_mean"], (1 + 3 + 2) / 3)


def test_check_rows_names_the_role():
  c = _config()
  c.num_minibatches, c.jolt.teacher_samples = 8, 1
  with pytest.raises(producers.SetupError, match="teacher role's prompts_per_step"):
    jolt.check_rows(c, data=None, batch_divisor=1)
  jolt.check_rows(_config(), data=None, batch_divisor=1)
