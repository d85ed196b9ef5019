"""Extensions: what joins the RL update besides the estimator's advantages.

Some methods add more than advantages: a filter over prompt groups (PRIME, DAPO), rows of a
second role (JOLT's teacher, SPD-RAG's document agents), a batch of its own with an objective
of its own (CSO, InT, PROPA), a controller of the loss mix (AMFT), an estimator's own loss
term (VIMPO, VeriFree, JEPO). Each is one module here declaring one `Extension`
(`experiments/extensions/base.py`): its settings checks, the fields it needs, the producer
stages it adds and where, the rows it brings into the update batch, its weighted loss terms,
a controller, what it does when a step has nothing to train.

`EXTENSIONS` lists them in a fixed order (their checks run, their stages are placed and their
rows are added in it); `enabled(c)` is the run's. The runner (`experiments/loop.py`) and the
update (`experiments/train.py`) iterate over these and name none. A new extension is one
module with its `EXTENSION` and a line in the table below, plus its test.
"""
from __future__ import annotations

import ml_collections

from experiments.extensions import (amft, context, critical, estimator_loss, group_filter,
                                    jolt, subagents)
from experiments.extensions.base import (Built, Extension, Placed, Resolved, SetupError, Step,
                                         TurnSampler, place)

EXTENSIONS: tuple[Extension, ...] = (
    jolt.EXTENSION,
    subagents.EXTENSION,
    group_filter.EXTENSION,
    critical.EXTENSION,
    estimator_loss.EXTENSION,
    amft.EXTENSION,
    context.EXTENSION,
)


def get(name: str) -> Extension:
  """The extension called `name`; KeyError listing the known names."""
  for ext in EXTENSIONS:
    if ext.name == name:
      return ext
  raise KeyError(f"no extension {name!r}; known: {[e.name for e in EXTENSIONS]}")


def enabled(c: ml_collections.ConfigDict) -> tuple[Extension, ...]:
  """The extensions `c` turns on, in the table's order."""
  return tuple(ext for ext in EXTENSIONS if ext.on(c))


__all__ = ["Built", "EXTENSIONS", "Extension", "Placed", "Resolved", "SetupError", "Step",
           "TurnSampler", "enabled", "get", "place"]
