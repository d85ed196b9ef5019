"""Context management of long episodes (`context`): the run's multi-turn sampler becomes a
`credit.envs.context.ContextSampler` when the task asks for it.

A task with `context_keep_last` >= 1 (e.g. `search_qa`'s long recipe) plays episodes past the
token budget `max_new_tokens`: when an episode's context is full, its oldest observations are
replaced by a placeholder (the newest `context_keep_last` kept) until it takes at most
`context_compact_to` of the budget, and the episode continues from the compacted context. The
training row is the final context (module docstring of `credit.envs.context`), so every
scorer of the run recomputes the sampler's log-probs. Training and evaluation episodes use the
same sampler. Metrics: the env rollout's `compactions` and `dropped_observations` per episode.
"""
from __future__ import annotations

from typing import Any

import ml_collections

from credit import tasks as tasks_lib
from credit.envs.context import ContextSampler
from experiments.extensions.base import Extension, TurnSampler


def _task(c: ml_collections.ConfigDict) -> Any:
  try:
    return tasks_lib.get_task(c.task, **dict(c.task_kwargs))
  except (KeyError, TypeError, ValueError):
    return None


def on(c: ml_collections.ConfigDict) -> bool:
  """The task asks for context management (`context_keep_last` >= 1)."""
  return int(getattr(_task(c), "context_keep_last", 0) or 0) >= 1


def turn_sampler(data) -> TurnSampler:
  task = data.task
  return TurnSampler(ContextSampler, {"keep_last": int(task.context_keep_last),
                                      "compact_to": float(task.context_compact_to)},
                     data.max_prompt_len)


EXTENSION = Extension(
    name="context_management", on=on, turn_sampler=turn_sampler,
    doc="long episodes: the oldest observations dropped when the context is full, the row "
        "is the final context (credit.envs.context)")
