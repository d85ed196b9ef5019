"""Shared body of the token-family tests (tests/advantages/token/<name>_test.py).

Each method file declares a `Case` table (estimator, fields, static configuration, numpy
reference, tolerances) and gets its reference test from `reference_test(CASES)`, the way
tests/advantages/outcome/_harness.py does for the outcome family. The checks the files
share besides (reduction to GRPO, sign and budget kept) are the `grpo_of` / `assert_*`
helpers below.

Shapes are fixed (tests/advantages/token/_ref.py: N=4 groups x G=4 samples, T=6 tokens,
M=2 interventions), so each case compiles once (`run` jits once per case).
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

from credit.advantages import grpo_advantages
from tests.advantages.token import _ref
from tests.advantages.token._ref import N, pick

__all__ = ["Case", "assert_budget_kept", "assert_leaves_close", "assert_sign_kept",
           "assert_reduces_to_grpo", "check_reference", "grpo_of", "reference_test", "run",
           "table"]


@dataclasses.dataclass(frozen=True)
class Case:
  """An estimator with one static configuration, how to feed it, and its numpy reference.

  `ref(b, **kwargs)` returns the expected output (one array, or a tuple in the order of
  the output's leaves). `draw(data)`, if given, draws extra inputs (e.g. a state) that are
  added to the batch before both the call and the reference.
  """
  id: str
  fn: Callable
  fields: tuple[str, ...]
  ref: Callable[..., object]
  kwargs: tuple = ()              # static config / hyperparameters (hashable items)
  group: bool = True              # takes num_groups (= N)
  batches: Callable = _ref.batches  # strategy factory, batches(contiguous=...)
  draw: Callable | None = None
  rtol: float = 1e-4
  atol: float = 1e-5

  def __str__(self) -> str:       # the pytest id
    return self.id

  @property
  def contiguous(self) -> bool:
    """Fast-path configurations (a static group_size) get contiguous group ids."""
    return dict(self.kwargs).get("group_size") is not None

  def hyper(self) -> dict:
    kw = dict(self.kwargs)
    if self.group:
      kw["num_groups"] = N
    return kw


def table(fn: Callable, fields: tuple[str, ...], ref: Callable, configs: dict,
          **common) -> list[Case]:
  """One `Case` per named static configuration (sorted by name), `common` shared by all."""
  return [Case(name, fn, fields, ref, tuple(sorted(cfg.items())), **common)
          for name, cfg in sorted(configs.items())]


@functools.lru_cache(maxsize=None)
def _jitted(case: Case):
  return jax.jit(functools.partial(case.fn, **case.hyper()))


def run(case: Case, b: dict) -> tuple:
  """The estimator's output leaves as numpy arrays (jitted once per case)."""
  out = _jitted(case)(**pick(b, *case.fields))
  return tuple(np.asarray(x) for x in jax.tree.leaves(out))


def assert_leaves_close(got: tuple, want, rtol: float, atol: float) -> None:
  """Float leaves agree within the tolerances (in float64); bool and int leaves exactly."""
  want = want if isinstance(want, tuple) else (want,)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    if g.dtype.kind in "biu":
      np.testing.assert_array_equal(g, np.asarray(w))
    else:
      np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol)


def check_reference(case: Case, data) -> None:
  """Estimator == numpy reference on one hypothesis batch (contiguous ids on fast paths)."""
  b = data.draw(case.batches(contiguous=case.contiguous))
  if case.draw is not None:
    b = dict(b, **case.draw(data))
  assert_leaves_close(run(case, b), case.ref(b, **dict(case.kwargs)), case.rtol, case.atol)


def reference_test(cases: list[Case], max_examples: int = 12):
  """The per-method test against the numpy reference, parametrized over `cases`.

  In a test module: `test_matches_numpy_reference = reference_test(CASES)`.
  """

  @pytest.mark.parametrize("case", cases, ids=str)
  @hypothesis.settings(max_examples=max_examples)
  @hypothesis.given(data=st.data())
  def test_matches_numpy_reference(case, data):
    check_reference(case, data)

  return test_matches_numpy_reference


# --------------------------------------------------------------------------
# Reductions to GRPO, sign and budget.
# --------------------------------------------------------------------------


def grpo_of(b: dict, **kw) -> np.ndarray:
  """GRPO's advantages of the batch (the sequence advantage every token method starts from)."""
  return np.asarray(grpo_advantages(**pick(b, "reward", "group_id", "response_mask"),
                                    num_groups=N, **kw))


def assert_reduces_to_grpo(outs, grpo, rtol: float, atol: float) -> None:
  """Each output (an array or an estimator output with `.advantages`) equals GRPO's."""
  for a in outs:
    a = getattr(a, "advantages", a)
    np.testing.assert_allclose(np.asarray(a), grpo, rtol=rtol, atol=atol)


def assert_sign_kept(a, grpo) -> None:
  """Every token keeps the sign of its sequence's advantage (zeros stay zero)."""
  np.testing.assert_array_equal(np.sign(np.asarray(a)), np.sign(grpo))


def assert_budget_kept(a, grpo, rtol: float = 1e-4, atol: float = 1e-4) -> None:
  """Each row's credit sums to GRPO's (L·Â): the weights redistribute, never scale."""
  np.testing.assert_allclose(np.asarray(a, np.float64).sum(-1),
                             np.asarray(grpo, np.float64).sum(-1), rtol=rtol, atol=atol)
