"""The extension protocol: what joins the RL update besides the estimator's advantages.

An extension is one `Extension` record (declared in its own module, listed in
`experiments.extensions.EXTENSIONS`). Its hooks, all optional but `name` and `on`:

* settings: `check(c)` refuses a setting it cannot run (every run, on or off, before any
  file is written); `check_run(c, data=, batch_divisor=)` once the data and the mesh are
  known (still before any file);
* the method: `needs(c, est)` the contract fields it reads ({field: who needs it}, planned
  like the estimator's); `resolve(c, est, hyper)` what it fixes for the run (`Resolved`:
  a value kept in `Method.extensions[name]`, the fields it adds to the update batch);
* rows of its own: `row_sets(c)` the `train.RowSet`s it trains besides the step's rollout
  (a second role's rows), `main_role` what it calls the rollout's rows (their loss is then
  reported as `loss_<main_role>`);
* the run: `build(setup, method) -> Built`: its producer stages and where they go, the hook
  that puts its rows into the update batch, its weighted loss terms, a weight on the main
  rows' loss, a controller of the loss mix, what it does when a step has nothing to train;
* the rollout: `turn_sampler(data)` a multi-turn sampler of its own, `sft_prompts(c, data)`
  the supervised warm-up's prompts.

The loop iterates over the enabled extensions in the table's order; it never names one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import ml_collections

from experiments import producers, train

SetupError = producers.SetupError
Config = ml_collections.ConfigDict


class Resolved(NamedTuple):
  """What an extension fixes for a run when the method is resolved: `value` (kept in
  `Method.extensions[name]`) and `update_fields`, batch fields the update reads from the
  main rows (they are cut from the step's batch with the update's own fields)."""
  value: Any = None
  update_fields: frozenset = frozenset()


class Placed(NamedTuple):
  """A producer stage of an extension and where it runs: right after the stage that makes
  the field `after` (e.g. "reward"), or after every planned stage (`after=None`)."""
  stage: producers.Stage
  after: str | None = None


class Step(NamedTuple):
  """What `Built.rows` sees of one step: the train state before the update, the step's batch
  (its fields, `advantages` and the estimator's targets), the step context and whether the
  rows it adds are to be checked against the contract (`credit.validate_fields`)."""
  state: Any
  batch: Mapping[str, Any]
  ctx: producers.StepContext
  validate: bool


class TurnSampler(NamedTuple):
  """A multi-turn sampler of an extension's own: its class, the extra keyword arguments it
  takes and the prompt width its prompts need (the turn layout's prompt columns widen to it)."""
  cls: type
  kwargs: Mapping[str, Any]
  prompt_width: int


@dataclasses.dataclass(frozen=True)
class Built:
  """What an enabled extension adds to one run (`Extension.build`).

  stages: `Placed` producer stages.
  rows: `rows(parts, step: Step) -> parts`: the update batch ({part: arrays}; the rollout's
    rows under `train.MAIN`) with this extension's rows or whole parts added.
  terms: its `train.LossTerm`s (on a row set's model pass, or own-pass terms on its parts).
  main_weight: the weight of the main rows' loss in the objective (number or
    `weight(minibatch)`), None: 1.
  controller: a `train.Controller` of the loss mix (its state in `TrainState.controller`).
  skip: `skip(batch, ctx) -> bool`: True when the step has nothing to train; the step then
    makes no update and reports `update_skipped` = 1.
  """
  stages: tuple[Placed, ...] = ()
  rows: Callable[[dict, Step], dict] | None = None
  terms: tuple[train.LossTerm, ...] = ()
  main_weight: float | Callable | None = None
  controller: train.Controller | None = None
  skip: Callable[[Mapping[str, Any], producers.StepContext], bool] | None = None


def _no_check(c: Config) -> None:
  del c


def _no_rows(c: Config) -> tuple:
  del c
  return ()


def _nothing_built(setup: producers.Setup, method: Any) -> Built:
  del setup, method
  return Built()


@dataclasses.dataclass(frozen=True)
class Extension:
  """One extension of the RL update (see the module docstring for each hook)."""
  name: str
  on: Callable[[Config], bool]
  check: Callable[[Config], None] = _no_check
  check_run: Callable[..., None] | None = None
  needs: Callable[[Config, Any], Mapping[str, str]] | None = None
  resolve: Callable[[Config, Any, Mapping[str, Any]], Resolved] | None = None
  row_sets: Callable[[Config], tuple[train.RowSet, ...]] = _no_rows
  main_role: str | None = None
  build: Callable[[producers.Setup, Any], Built] = _nothing_built
  turn_sampler: Callable[[Any], TurnSampler] | None = None
  sft_prompts: Callable[[Config, Any], Callable | None] | None = None
  doc: str = ""


def place(stages: list[producers.Stage], placed: Placed, who: str) -> list[producers.Stage]:
  """`stages` with `placed.stage` right after the first stage that makes `placed.after`, or
  at the end. Raises SetupError when no stage makes that field."""
  if placed.after is None:
    return stages + [placed.stage]
  for i, st in enumerate(stages):
    if placed.after in st.wanted:
      return stages[:i + 1] + [placed.stage] + stages[i + 1:]
  raise SetupError(f"{who} needs the step's {placed.after}, which no stage makes")
