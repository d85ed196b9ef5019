"""The task interface, the task registry, and example normalisation.

A task is a small frozen dataclass (hashable, no state) with

  name: str                                   registry key
  generate(rng, n) -> list[dict]              n examples, deterministic given the rng state
  verify(example, response) -> float          reward in [0, 1], 1 = correct
  demonstration(example) -> str               a response that verifies as 1.0
  int_fields: dict[str, tuple[int, ...]]      task-specific integer fields and their shapes
  max_prompt_chars, max_response_chars: int   bounds over every generated example

and optionally

  generate_eval(rng, n) -> list[dict]         held-out examples for the runner's eval split,
                                              for a task drawing from a finite set (lookup's
                                              questions file); default: `generate`
  flag_chars(example, response) -> [len(response)+1] bool
                                              characters inside spans judged wrong (the
                                              last entry: the response's end, its stop
                                              token); the runner's `flag_mask` producer
                                              maps them to response tokens (Perceval)
  interventions(example) -> list[str]         M answer-preserving rewrites of the prompt (M
                                              fixed per task); the runner's
                                              `logprob_interventions` producer re-scores the
                                              response after each (SCAPO)
  verify_many(examples, responses) -> [B]     `verify` of a batch at once (e.g. concurrent
                                              sandboxed runs); `verify_batch` uses it
  answer_marker: str                          the response is reasoning, this marker, then
                                              the answer (`chain`: "46,41=41"); `answer` is
                                              then the final answer alone, and the runner's
                                              `answer_pass` producer teacher-forces it after
                                              the response cut at its first marker

Each example is a dict with `prompt: str`, `answer: str` (a reference correct
response) and the task's `int_fields` (python ints, or lists for shaped fields).

`response` is text decoded up to the end-of-sequence token (`CharTokenizer.decode`
and `decode_responses` stop there), so what a model writes after eos never
reaches a verifier. With the character tokenizer, a response string index is a
response token index, a prompt takes `max_prompt_chars + 1` tokens (bos) and a
demonstration `max_response_chars + 1` (eos).
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np


class Task(Protocol):
  """What the runner expects of a task (see module docstring)."""
  name: str
  int_fields: dict[str, tuple[int, ...]]
  max_prompt_chars: int
  max_response_chars: int

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]: ...

  def verify(self, example: Mapping[str, Any], response: str) -> float: ...

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    """A response the supervised warm-up imitates. `rng` draws from a stochastic demonstrator
    (a task option, e.g. arithmetic's `demo_carry_error`); deterministic tasks ignore it."""


class UnknownTaskError(KeyError):
  """An unknown task name; the message lists the known ones."""

  def __str__(self) -> str:
    return str(self.args[0])


_TASKS: dict[str, Callable[..., Any]] = {}


def register_task(name: str):
  """Class decorator adding a task class to the registry under `name`."""
  def deco(cls):
    old = _TASKS.get(name)
    # Re-registering the same class (a module reload) is fine; a different one is not.
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__,
                                                                  cls.__qualname__):
      raise ValueError(f"Task {name!r} is already registered to {old.__module__}."
                       f"{old.__qualname__}")
    _TASKS[name] = cls
    return cls
  return deco


def list_tasks() -> list[str]:
  """Sorted names of the registered tasks."""
  return sorted(_TASKS)


def get_task(name: str, **kwargs) -> Any:
  """The task `name` built with `kwargs` (its dataclass fields).

  Raises:
    UnknownTaskError: unknown name; lists the known names.
    TypeError: an unknown keyword; lists the task's fields.
  """
  if name not in _TASKS:
    close = difflib.get_close_matches(name, list(_TASKS), n=3)
    hint = f" Did you mean {close}?" if close else ""
    raise UnknownTaskError(f"Unknown task {name!r}.{hint} Known tasks: {list_tasks()}")
  cls = _TASKS[name]
  fields = [f.name for f in dataclasses.fields(cls) if f.init]
  unknown = sorted(set(kwargs) - set(fields))
  if unknown:
    raise TypeError(f"Task {name!r} has no option(s) {unknown}; its options are {fields}")
  return cls(**kwargs)


def as_example(record: Mapping[str, Any]) -> dict:
  """A record from any source (tfds data source, grain, JSON) as a plain example dict.

  bytes -> str, numpy scalars -> int/float/bool, numpy arrays -> lists.
  """
  out = {}
  for k, v in record.items():
    if isinstance(v, bytes):
      v = v.decode("utf-8")
    elif isinstance(v, np.ndarray):
      if v.dtype.kind in "SO" and v.ndim == 0:
        v = v.item()
        v = v.decode("utf-8") if isinstance(v, bytes) else v
      else:
        v = v.tolist()
    elif isinstance(v, np.generic):
      v = v.item()
    out[k] = v
  return out


def verify_batch(task: Any, examples: Sequence[Mapping[str, Any]] | Mapping[str, Any],
                 responses: Sequence[str]) -> np.ndarray:
  """Rewards `[B] float32` of `responses` against `examples`.

  `examples` is a list of example dicts or a batch dict of B-long columns (as
  `make_loader` yields); examples may be repeated G times by the caller.
  """
  if isinstance(examples, Mapping):
    keys = list(examples)
    b = len(examples[keys[0]]) if keys else 0
    examples = [{k: examples[k][i] for k in keys} for i in range(b)]
  if len(examples) != len(responses):
    raise ValueError(f"{len(examples)} examples but {len(responses)} responses")
  many = getattr(task, "verify_many", None)  # a task that verifies a batch at once
  if many is not None:
    return np.asarray(many([as_example(e) for e in examples], list(responses)),
                      dtype=np.float32)
  return np.asarray([task.verify(as_example(e), r) for e, r in zip(examples, responses)],
                    dtype=np.float32)


def int_field(example: Mapping[str, Any], key: str) -> int:
  """An integer field of an example as a python int (accepts numpy scalars)."""
  return int(np.asarray(example[key]).item())


def text_field(example: Mapping[str, Any], key: str) -> str:
  """A text field of an example as str (accepts bytes and 0-d numpy arrays)."""
  v = example[key]
  if isinstance(v, np.ndarray):
    v = v.item()
  return v.decode("utf-8") if isinstance(v, bytes) else str(v)
