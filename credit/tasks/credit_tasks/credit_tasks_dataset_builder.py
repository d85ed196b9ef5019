"""tfds builder `credit_tasks`: one BuilderConfig per (task, options, sizes, seed).

Writes `array_record` files that `tfds.data_source(...)` / `builder.as_data_source()`
read back without TensorFlow. The builder lives in a package module named
`<name>/<name>_dataset_builder.py` because tfds derives the dataset name and its
metadata directory from that location (`dataset_info_from_configs`).

Splits are generated deterministically: `train` from `np.random.default_rng([seed, 0])`,
`test` from `np.random.default_rng([seed, 1])`, and stored in generation order
(`disable_shuffling=True`), so `source[i] == task.generate(rng, n)[i]` — for `test`,
`task.generate_eval(rng, n)[i]` when the task defines it (its held-out examples, e.g. the
program task's held-out target functions; the runner's eval split draws the same way). Other
tasks' splits are independent draws: on small task spaces (pivotal has 10·response_len
distinct prompts) test prompts also occur in train.

Features: `prompt`, `answer` (text) and the task's `int_fields` (int64 tensors).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from credit.tasks import base

DEFAULT_TRAIN_SIZE = 10_000
DEFAULT_TEST_SIZE = 512
DEFAULT_SEED = 0
SPLIT_STREAMS = {"train": 0, "test": 1}


@dataclasses.dataclass(eq=False)
class TaskConfig(tfds.core.BuilderConfig):
  """Which task, with which options, how many examples, from which seed.

  `task_kwargs` is a JSON string of the task's non-default options (so the
  config stays hashable and printable); build configs with `make_config`.
  """
  task: str = ""
  task_kwargs: str = "{}"
  train_size: int = DEFAULT_TRAIN_SIZE
  test_size: int = DEFAULT_TEST_SIZE
  seed: int = DEFAULT_SEED

  def make_task(self) -> Any:
    return base.get_task(self.task, **json.loads(self.task_kwargs))


def _non_default_options(task_obj: Any) -> dict:
  default = type(task_obj)()
  return {f.name: getattr(task_obj, f.name) for f in dataclasses.fields(task_obj)
          if f.init and getattr(task_obj, f.name) != getattr(default, f.name)}


def make_config(task: str | Any, *, train_size: int = DEFAULT_TRAIN_SIZE,
                test_size: int = DEFAULT_TEST_SIZE, seed: int = DEFAULT_SEED,
                **task_kwargs) -> TaskConfig:
  """A TaskConfig for a task name (+ options) or a task object.

  The config name is the task name when everything is default, else
  `<task>_<10 hex digits>` hashing the options, sizes and seed, so different
  settings never share files in one `data_dir`.
  """
  if not isinstance(task, str) and task_kwargs:
    raise TypeError("Pass options either in the task object or as keywords, not both")
  task_obj = base.get_task(task, **task_kwargs) if isinstance(task, str) else task
  options = _non_default_options(task_obj)
  options_json = json.dumps(options, sort_keys=True)
  spec = {"options": options, "train_size": train_size, "test_size": test_size, "seed": seed}
  is_default = (not options and train_size == DEFAULT_TRAIN_SIZE
                and test_size == DEFAULT_TEST_SIZE and seed == DEFAULT_SEED)
  digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
  name = task_obj.name if is_default else f"{task_obj.name}_{digest}"
  return TaskConfig(name=name, description=json.dumps({"task": task_obj.name, **spec}),
                    task=task_obj.name, task_kwargs=options_json, train_size=train_size,
                    test_size=test_size, seed=seed)


class Builder(tfds.core.GeneratorBasedBuilder):
  """The built-in credit tasks (arithmetic, countdown, pivotal, program, and the bifurcation
  tasks of the credit benchmark) as a tfds dataset."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.0.0": "Initial release.",
                   "1.1.0": "test split from the task's generate_eval where it has one "
                            "(program: held-out target functions)."}
  BUILDER_CONFIGS = [make_config(name) for name in ("arithmetic", "countdown", "pivotal",
                                                    "program", "pivotal_and", "pivotal_or",
                                                    "distractor", "delayed",
                                                    "pivot_turn")]

  def _info(self) -> tfds.core.DatasetInfo:
    task = self.builder_config.make_task()
    features = {"prompt": tfds.features.Text(), "answer": tfds.features.Text()}
    for key, shape in task.int_fields.items():
      features[key] = tfds.features.Tensor(shape=shape, dtype=np.int64)
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(features), disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    cfg = self.builder_config
    return {"train": self._generate_examples("train", cfg.train_size),
            "test": self._generate_examples("test", cfg.test_size)}

  def _generate_examples(self, split: str, n: int):
    cfg = self.builder_config
    task = cfg.make_task()
    rng = np.random.default_rng([cfg.seed, SPLIT_STREAMS[split]])
    draw = task.generate
    if split == "test" and callable(getattr(task, "generate_eval", None)):
      draw = task.generate_eval  # the task's own held-out examples, as the runner's eval split
    for i, ex in enumerate(draw(rng, n)):
      yield i, {k: ex[k] for k in ("prompt", "answer", *task.int_fields)}
