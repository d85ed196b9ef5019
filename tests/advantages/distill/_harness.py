"""Shared body of the distillation-family tests (tests/advantages/distill/<name>_test.py).

Each method file declares a `Case` table (estimator, fields, static configuration, numpy
reference, batches, tolerances) and gets its reference test from `reference_test(CASES)`,
the way tests/advantages/outcome/_harness.py does for the outcome family. The batches are
the seeded generators of the reference modules (`_ref_teach.batch`, `_ref_steps.make_batch`)
or the hypothesis strategy of `_ref_ctx` (`hypothesis_reference_test`), whose shapes are
fixed, so each case compiles once (`run` jits once per case).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from tests.advantages.distill import _ref_teach

__all__ = ["Case", "check_reference", "hypothesis_reference_test", "reference_test", "run",
           "table"]


@dataclasses.dataclass(frozen=True)
class Case:
  """An estimator with one static configuration, how to feed it, and its numpy reference.

  `ref(b, **kwargs, **ref_kwargs)` returns the expected [B,T] advantages.
  `batch(seed, contiguous=...)` builds the batches (for `seeds`); with `strategy` (a
  hypothesis strategy factory, strategy(contiguous=...)) the batches are drawn instead
  (`hypothesis_reference_test`). `prep`, if given, edits a batch before both the call and
  the reference.
  """
  id: str
  fn: Callable
  fields: tuple[str, ...]
  ref: Callable[..., np.ndarray]
  kwargs: tuple = ()               # static config / hyperparameters (hashable items)
  ref_kwargs: tuple = ()           # extra reference-only options
  seeds: tuple[int, ...] = (0, 1)
  contiguous: bool | None = None   # None: contiguous ids exactly on fast paths (group_size)
  batch: Callable = _ref_teach.batch
  num_groups: int = _ref_teach.N
  strategy: Callable | None = None
  prep: Callable | None = None
  rtol: float = 1e-5
  atol: float = 1e-5

  def __str__(self) -> str:        # the pytest id
    return self.id

  def _contiguous(self) -> bool:
    if self.contiguous is None:
      return dict(self.kwargs).get("group_size") is not None
    return self.contiguous

  def make(self, seed: int) -> dict:
    b = self.batch(seed, contiguous=self._contiguous())
    return b if self.prep is None else self.prep(b)

  def draw(self, data) -> dict:
    b = data.draw(self.strategy(contiguous=self._contiguous()))
    return b if self.prep is None else self.prep(b)


def table(fn: Callable, fields, ref: Callable, configs: dict, *,
          default_seeds: tuple[int, ...] | None = None, **common) -> list[Case]:
  """One `Case` per named configuration (sorted by name), `common` shared by all.

  `fields` is a tuple, or a function of the configuration (fields some options switch on);
  `default_seeds` overrides `seeds` for the configuration named "default".
  """
  cases = []
  for name, cfg in sorted(configs.items()):
    kw = dict(common)
    if default_seeds is not None and name == "default":
      kw["seeds"] = default_seeds
    names = fields(cfg) if callable(fields) else fields
    cases.append(Case(name, fn, names, ref, tuple(sorted(cfg.items())), **kw))
  return cases


@functools.lru_cache(maxsize=None)
def _jitted(case: Case):
  return jax.jit(functools.partial(case.fn, num_groups=case.num_groups, **dict(case.kwargs)))


def run(case: Case, b: dict):
  """The estimator's output on batch `b` (jitted once per case)."""
  return _jitted(case)(**{k: b[k] for k in case.fields})


def check_reference(case: Case, b: dict) -> None:
  """Estimator == numpy reference on batch `b`."""
  got = np.asarray(run(case, b), np.float64)
  want = case.ref(b, **dict(case.kwargs), **dict(case.ref_kwargs))
  np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)


def reference_test(cases: list[Case]):
  """The per-method test against the numpy reference, one test per (case, seed).

  In a test module: `test_matches_numpy_reference = reference_test(CASES)`.
  """
  params = [pytest.param(c, s, id=f"{c.id}-{s}") for c in cases for s in c.seeds]

  @pytest.mark.parametrize("case,seed", params)
  def test_matches_numpy_reference(case, seed):
    check_reference(case, case.make(seed))

  return test_matches_numpy_reference


def hypothesis_reference_test(cases: list[Case], max_examples: int):
  """The same test on hypothesis batches (cases with a `strategy`), parametrized over `cases`."""

  @pytest.mark.parametrize("case", cases, ids=str)
  @hypothesis.settings(max_examples=max_examples)
  @hypothesis.given(data=st.data())
  def test_matches_numpy_reference(case, data):
    check_reference(case, case.draw(data))

  return test_matches_numpy_reference
