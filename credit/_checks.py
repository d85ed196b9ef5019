"""Eager checks of static arguments and name lookups, shared by the whole library.

Every "unknown name" error (estimator, loss, aggregation mode, KL kind, importance level,
a string hyperparameter) goes through `lookup` / `check_choice`, so they all read alike:
the bad value, the closest known names, and the full list. These run in Python, before
tracing; nothing here is called inside a jitted body on traced values.
"""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping, TypeVar

V = TypeVar("V")


class UnknownNameError(KeyError, ValueError):
  """An unknown name; the message lists the known ones.

  A `KeyError` (a failed registry lookup) and a `ValueError` (a bad argument value), so
  callers may catch either.
  """

  def __str__(self) -> str:  # KeyError quotes its message otherwise
    return str(self.args[0])


def unknown(what: str, name: Any, known: Iterable[str]) -> UnknownNameError:
  """The error for `name` not among `known`, with close matches first."""
  known = sorted(str(k) for k in known)
  close = difflib.get_close_matches(str(name), known, n=3) if isinstance(name, str) else []
  hint = f" Did you mean {close}?" if close else ""
  return UnknownNameError(f"Unknown {what} {name!r}.{hint} Known: {known}")


def lookup(table: Mapping[str, V], name: Any, what: str) -> V:
  """`table[name]`, or `UnknownNameError` naming `what` and listing the keys."""
  try:
    return table[name]
  except (KeyError, TypeError):
    raise unknown(what, name, table) from None


def check_choice(fn: str, arg: str, value: Any, choices: Iterable[Any]) -> None:
  """Raises `UnknownNameError` when a static string argument is not one of `choices`."""
  choices = tuple(choices)
  if value not in choices:
    raise unknown(f"{fn}: {arg}", value, choices)


def check_int(fn: str, arg: str, value: Any, minimum: int = 1) -> None:
  """A static integer argument (a Python int, not a traced array) of at least `minimum`."""
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{fn}: {arg} must be a Python int >= {minimum} (static under jit), "
                     f"got {value!r}")
