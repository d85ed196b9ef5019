"""The planner: which producers make the fields a run needs, in which order.

`plan(needed, c)` picks, for each needed field, the first producer of the table
(`base.table()`) that provides it and is enabled by the config (`when`), adds the producers
of what those require, and orders them by dependency (the rollout root first). A field no
enabled producer makes is refused at setup, naming the field, the method that needs it and
the producers that could make it and why they are off.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import ml_collections

from credit import CONTRACT

from experiments.producers import base
from experiments.producers.base import (MissingFieldsError, Produce, Producer, Setup, SetupError,
                                        StepContext)
from experiments.producers.rollouts import (tree_batch)


def providers(c: ml_collections.ConfigDict,
              table: Iterable[Producer] | None = None) -> dict[str, Producer]:
  """{field: the producer that makes it under config `c`} (first enabled row wins)."""
  out: dict[str, Producer] = {}
  for p in base.table() if table is None else table:
    if p.when(c):
      for f in p.provides:
        out.setdefault(f, p)
  return out


@dataclasses.dataclass(frozen=True)
class Planned:
  """A producer in a plan, with the provided fields the plan takes from it."""
  producer: Producer
  wanted: frozenset

  def build(self, setup: Setup) -> "Stage":
    built = self.producer.build(setup, self.wanted)
    produce, after = built if self.producer.init is not None else (built, None)
    return Stage(self.producer.name, self.producer.phase, self.wanted, produce, after)


@dataclasses.dataclass(frozen=True)
class Stage:
  """A built producer: calling it returns its wanted fields and the runner fields it makes
  (`base.RUNNER_FIELDS`); `after` (trained
  producers) is called with the batch and the estimator's value targets."""
  name: str
  phase: str
  wanted: frozenset
  produce: Produce
  after: Callable[[Mapping[str, Any], Mapping[str, Any], StepContext], None] | None = None

  def __call__(self, state, batch, ctx: StepContext) -> dict:
    out = self.produce(state, batch, ctx)
    return ({f: out[f] for f in sorted(self.wanted)}
            | {f: v for f, v in out.items() if f not in CONTRACT})


def plan(needed: Mapping[str, Iterable[str]], c: ml_collections.ConfigDict,
         table: Iterable[Producer] | None = None) -> list[Planned]:
  """The producers that make `needed` ({field: who needs it}), in dependency order.

  Raises:
    SetupError naming, per method, each needed field that no enabled producer makes.
  """
  table = base.table() if table is None else tuple(table)
  made = providers(c, table)
  missing: dict[str, list[str]] = {}
  for field, whos in needed.items():
    if field not in made:
      for who in whos:
        missing.setdefault(who, []).append(field)
  if missing:
    absent = {f for fs in missing.values() for f in fs}
    off = {p.name: (sorted(absent & set(p.provides)), p.off_doc or "see its `when`")
           for p in table if absent & set(p.provides)}
    raise MissingFieldsError(missing, off, made)
  root = next(p for p in table if p.when(c))  # the rollout (single- or multi-turn)
  wanted: dict[str, set] = {root.name: set()}
  todo = list(needed)
  while todo:
    field = todo.pop()
    p = made[field]
    if field in wanted.setdefault(p.name, set()):
      continue
    wanted[p.name].add(field)
    for r in p.requires:
      if r not in made:
        raise SetupError(f"producer {p.name!r} (for {field!r}) requires {r!r}, which no "
                         "producer makes under this config")
      todo.append(r)
  chosen = [p for p in table if p.name in wanted]
  if tree_batch(c):
    bad = [p.name for p in chosen if not p.trees]
    if bad:
      raise SetupError(f"producers {bad} assume G contiguous samples per prompt and cannot run "
                       f"on tree rollouts (tree.branches > 0); with trees the loop makes "
                       f"{sorted(p.name for p in table if p.trees)}")
  for p in chosen:
    if p.check is not None:
      p.check(c)
  return [Planned(p, frozenset(wanted[p.name])) for p in _dependency_order(chosen, made)]


def _dependency_order(chosen: list[Producer], made: Mapping[str, Producer]) -> list[Producer]:
  """Producers ordered so each comes after the producers of what it requires (stable)."""
  done: list[Producer] = []
  left = list(chosen)
  while left:
    ready = [p for p in left if all(made[r] in done or made[r] is p for r in p.requires)]
    if not ready:
      raise SetupError(f"producers {[p.name for p in left]} require each other's fields")
    done.append(ready[0])
    left.remove(ready[0])
  return done
