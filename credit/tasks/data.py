"""Example sources (built-in tfds datasets, user JSONL / tfds) and the grain loader.

Every source is a random-access sequence of example dicts
`{"prompt": str, "answer": str, ...}`; `make_loader` shuffles, repeats and
batches one with grain's `MapDataset`, and its iterator position is a small dict
(`get_state()` / `set_state()`) the runner stores with its checkpoints.

Nothing here imports TensorFlow: tfds is used only through the array_record
file format and `data_source` (random access), which need no TF.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from credit.tasks.base import as_example

def default_data_dir() -> str:
  """`$CREDIT_DATA_DIR`, else `~/.cache/credit/tensorflow_datasets`."""
  return os.environ.get("CREDIT_DATA_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "credit", "tensorflow_datasets")


def build_task_dataset(task: str | Any, data_dir: str | os.PathLike | None = None, **kwargs):
  """Generates (once) the tfds dataset of a built-in task under `data_dir`; returns the builder.

  Args:
    task: a registered task name or task object.
    data_dir: tfds data directory (None: `default_data_dir()`).
    **kwargs: `train_size`, `test_size`, `seed` and, for a task name, the task's
      options; see `credit_tasks_dataset_builder.make_config`.

  A second call with the same settings reuses the files.
  """
  # Imported here so that `import credit.tasks` pulls in neither tfds nor the builder.
  import tensorflow_datasets as tfds
  from credit.tasks.credit_tasks import credit_tasks_dataset_builder as cb
  config = cb.make_config(task, **kwargs)
  data_dir = os.fspath(data_dir) if data_dir is not None else default_data_dir()
  # tfds refuses a config object named like a predefined one; pass those by name.
  predefined = {c.name for c in cb.Builder.BUILDER_CONFIGS}
  builder = cb.Builder(config=config.name if config.name in predefined else config,
                       data_dir=data_dir, file_format="array_record")
  stats = tfds.download.ComputeStatsMode.SKIP
  # No progress bars for these small, local generations; restore the caller's setting.
  shown = getattr(tfds.core.utils.tqdm_utils, "_active", True)
  tfds.display_progress_bar(False)
  try:
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(compute_stats=stats))
  finally:
    tfds.display_progress_bar(shown)
  return builder


def task_tfds_name(task: str | Any, **kwargs) -> str:
  """The tfds name "credit_tasks/<config>" of a built-in task's dataset (for `tfds.data_source`)."""
  from credit.tasks.credit_tasks import credit_tasks_dataset_builder as cb
  return f"credit_tasks/{cb.make_config(task, **kwargs).name}"


def task_data_source(task: str | Any, split: str, data_dir: str | os.PathLike | None = None,
                     **kwargs) -> "ExampleSource":
  """Random-access examples of a built-in task's split (built on first use).

  Records come back as example dicts (str text, python ints / lists), so
  `task.verify(source[i], response)` works directly.
  """
  builder = build_task_dataset(task, data_dir, **kwargs)
  return ExampleSource(builder.as_data_source(split=split), as_example)


class ExampleSource(Sequence):
  """A random-access source with a per-record transform (a lazy `map`)."""

  def __init__(self, source: Sequence[Any], fn: Callable[[Any], dict]):
    self._source, self._fn = source, fn

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    n = len(self)
    index = int(index)
    if not -n <= index < n:
      raise IndexError(f"index {index} out of range for {n} examples")
    return self._fn(self._source[index % n])

  def __iter__(self):
    for i in range(len(self)):
      yield self[i]

  def __repr__(self) -> str:
    return f"ExampleSource({self._source!r}, n={len(self)})"


class MissingFieldError(KeyError):
  """A user example lacks the prompt or answer field; the message says where and what is there."""

  def __str__(self) -> str:  # KeyError would quote the message
    return str(self.args[0])


def _check_fields(where: str, present: Sequence[str], prompt_field: str,
                  answer_field: str) -> None:
  for field, role in ((prompt_field, "prompt"), (answer_field, "answer")):
    if field not in present:
      raise MissingFieldError(
          f"{where}: no {role} field {field!r}; fields present: {sorted(present)}. "
          f"Pass {role}_field= to name the right one.")


DATA_FORMATS = ("auto", "gsm8k", "math", "plain")


def boxed_answer(text: str) -> str | None:
  """The content of the LAST `\\boxed{...}` in `text` (balanced braces), else None.

  Nested braces work: "so \\boxed{\\frac{1}{2}}" -> "\\frac{1}{2}". A box never closed is
  ignored (the previous complete one, if any, is returned).
  """
  found = None
  for m in re.finditer(r"\\boxed\s*\{", text):
    depth, start = 1, m.end()
    for i in range(start, len(text)):
      ch = text[i]
      if ch == "{":
        depth += 1
      elif ch == "}":
        depth -= 1
        if depth == 0:
          found = text[start:i]
          break
  return found.strip() if found is not None else None


def gsm8k_answer(text: str) -> str | None:
  """The final answer of a GSM8K solution: what follows the last "####", commas removed."""
  if "####" not in text:
    return None
  return text.rsplit("####", 1)[1].strip().replace(",", "")


def detect_format(record: Mapping[str, Any], prompt_field: str = "prompt",
                  answer_field: str = "answer") -> str:
  """The JSONL format of one record: "plain" | "gsm8k" | "math".

  In order: "plain" when the record has `prompt_field` and `answer_field` (so naming fields
  always wins); "gsm8k" for {"question", "answer"} with "####" in the answer; "math" for
  {"problem", "solution"}; else "plain" (whose field check then names what is missing).
  """
  if prompt_field in record and answer_field in record:
    return "plain"
  if ("question" in record and isinstance(record.get("answer"), str)
      and "####" in record["answer"]):
    return "gsm8k"
  if "problem" in record and "solution" in record:
    return "math"
  return "plain"


def load_jsonl(path: str | os.PathLike, prompt_field: str = "prompt",
               answer_field: str = "answer", data_format: str = "auto", *,
               verifier: Any = None) -> list[dict]:
  """User examples from a JSON-lines file: one object per line, blank lines skipped.

  Formats (`data_format`; "auto" detects it from the first record with `detect_format`, and
  every line must then be in that format):
    plain: {prompt_field: ..., answer_field: ...} as given.
    gsm8k: {"question": ..., "answer": "... reasoning ...\\n#### 1,234"}; the prompt is the
      question, the gold answer what follows "####" with commas removed ("1234").
    math: {"problem": ..., "solution": "... \\boxed{...} ..."}; the prompt is the problem,
      the gold answer the content of the last \\boxed{...} (nested braces kept).

  Args:
    verifier: e.g. `MathVerifier()`; when given, every gold answer must parse with its
      `parse_gold`, else ValueError naming the file and the line numbers.

  Returns:
    `[{"prompt": str, "answer": str}, ...]`; a numeric answer becomes its str.

  Raises:
    MissingFieldError (a KeyError): a line without the prompt or answer field;
      the message names the file, the line number, the missing field and the
      fields present.
    ValueError: a line that is not a JSON object, a non-text prompt, a gsm8k answer
      without "####", a math solution without \\boxed{...}, an unknown format, or
      (with `verifier`) gold answers that do not parse.
  """
  if data_format not in DATA_FORMATS:
    raise ValueError(f"data_format={data_format!r}; valid: {' | '.join(DATA_FORMATS)}")
  path = os.fspath(path)
  out, lines = [], []
  fmt = None if data_format == "auto" else data_format
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
      if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
      if fmt is None:
        fmt = detect_format(record, prompt_field, answer_field)
      out.append(_formatted_example(record, where, fmt, prompt_field, answer_field))
      lines.append(lineno)
  if not out:
    raise ValueError(f"{path}: no examples")
  if verifier is not None:
    bad = [lines[i] for i in verifier.unparsable(out)]
    if bad:
      raise ValueError(
          f"{path}: {len(bad)} gold answer(s) do not parse with {type(verifier).__name__} "
          f"({fmt} format), at lines {bad[:20]}{' ...' if len(bad) > 20 else ''}")
  return out


def _formatted_example(record: Mapping[str, Any], where: str, fmt: str, prompt_field: str,
                       answer_field: str) -> dict:
  if fmt == "plain":
    return _user_example(record, where, prompt_field, answer_field)
  if fmt == "gsm8k":
    ex = _user_example(record, where + " (gsm8k format)", "question", "answer")
    gold = gsm8k_answer(ex["answer"])
    if not gold:
      raise ValueError(f"{where}: gsm8k format: the answer has no final '#### <answer>'")
  else:
    ex = _user_example(record, where + " (math format)", "problem", "solution")
    gold = boxed_answer(ex["answer"])
    if not gold:
      raise ValueError(f"{where}: math format: the solution has no complete \\boxed{{...}}")
  return {"prompt": ex["prompt"], "answer": gold}


def _user_example(record: Mapping[str, Any], where: str, prompt_field: str,
                  answer_field: str) -> dict:
  _check_fields(where, list(record), prompt_field, answer_field)
  record = as_example({prompt_field: record[prompt_field], answer_field: record[answer_field]})
  prompt, answer = record[prompt_field], record[answer_field]
  if not isinstance(prompt, str):
    raise ValueError(f"{where}: prompt field {prompt_field!r} is {type(prompt).__name__}, "
                     "not text")
  if answer is None or isinstance(answer, (list, dict)):
    raise ValueError(f"{where}: answer field {answer_field!r} is {type(answer).__name__}, "
                     "not text or a number")
  return {"prompt": prompt, "answer": str(answer)}


def load_tfds(name: str, split: str, data_dir: str | os.PathLike | None = None,
              prompt_field: str = "prompt", answer_field: str = "answer", *,
              download: bool = False) -> ExampleSource:
  """User examples from a tfds dataset already prepared (array_record) under `data_dir`.

  Args:
    name: tfds name, e.g. "my_dataset" or "my_dataset/config:1.0.0".
    split: e.g. "train", "test[:100]".
    data_dir: tfds data directory (None: tfds' default).
    prompt_field, answer_field: top-level feature names holding the text.
    download: let tfds download and prepare it (needs network; off by default).

  Returns:
    An `ExampleSource` of `{"prompt": str, "answer": str}`.

  Raises:
    MissingFieldError (a KeyError): a missing field; the message names the
      dataset and the fields present.
  """
  import tensorflow_datasets as tfds
  source = tfds.data_source(name, split=split, data_dir=None if data_dir is None
                            else os.fspath(data_dir), download=download)
  present = list(source.dataset_info.features.keys())
  where = f"tfds dataset {name!r} split {split!r}"
  _check_fields(where, present, prompt_field, answer_field)
  return ExampleSource(source, lambda r: _user_example(r, where, prompt_field, answer_field))


def collate(examples: Sequence[Mapping[str, Any]]) -> dict:
  """Batches example dicts: text fields -> list[str], numbers -> stacked numpy arrays."""
  out = {}
  for key in examples[0]:
    values = [e[key] for e in examples]
    out[key] = values if isinstance(values[0], str) else np.asarray(values)
  return out


def make_loader(source: Sequence[Any], batch_size: int, seed: int, shuffle: bool = True,
                num_epochs: int | None = None, *, drop_remainder: bool = True,
                shard_index: int = 0, num_shards: int = 1, num_threads: int = 0):
  """A checkpointable iterator of batches over a random-access source.

  Pipeline (grain `MapDataset`): records -> example dicts -> this process's
  shard (`source[shard_index::num_shards]`) -> shuffle(seed) -> repeat(num_epochs,
  reshuffled each epoch) -> batch(batch_size) with `collate`. Batches may span
  an epoch boundary. The order depends only on (source, seed, shard).

  Args:
    source: anything with `__len__` and `__getitem__` returning a record dict
      (a list of examples, `load_jsonl`, `load_tfds`, `task_data_source`, a tfds
      data source).
    batch_size: examples per batch.
    seed: shuffle seed.
    shuffle: shuffle (and reshuffle every epoch).
    num_epochs: passes over the data; None repeats forever.
    drop_remainder: drop a last short batch (fixed shapes for jit); set False
      for a single evaluation pass.
    shard_index, num_shards: e.g. `jax.process_index(), jax.process_count()`.
    num_threads: grain read threads (0 reads in the calling thread).

  Returns:
    A grain `DatasetIterator`: `next(it)` is a batch dict; `it.get_state()` is a
    JSON-able dict and `it.set_state(state)` resumes exactly there.
  """
  import grain
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not 0 <= shard_index < num_shards:
    raise ValueError(f"Need 0 <= shard_index < num_shards, got {shard_index}, {num_shards}")
  ds = grain.MapDataset.source(source).map(as_example)
  if num_shards > 1:
    ds = ds[shard_index::num_shards]
  if len(ds) == 0:
    raise ValueError("The source (shard) is empty")
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(num_epochs)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=collate)
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=2 * num_threads)
  return iter(ds.to_iter_dataset(options))
