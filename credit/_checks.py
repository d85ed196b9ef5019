"""Eager checks of static arguments and name lookups, shared by the whole library.

Every "unknown name" error (estimator, loss, aggregation mode, KL kind, importance level,
a string hyperparameter) goes through `lookup` / `check_choice`, so they all read alike:
the bad value, the closest known names, and the full list. These run in Python, before
tracing; nothing here is called inside a jitted body on traced values.
"""
from __future__ import annotations

import difflib
import inspect
import math
import numbers
import types
import typing
from typing import Any, Iterable, Mapping, TypeVar

import numpy as np

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



def _describe(value: Any) -> str:
  return f"{type(value).__name__} {value!r}"


def _type_name(t: Any) -> str:
  if t is type(None):
    return "None"
  names = {int: "an int", float: "a number", bool: "True or False", str: "a string"}
  return names.get(t, getattr(t, "__name__", None) or str(t).replace("typing.", ""))


def _is_number(value: Any) -> bool:
  return (isinstance(value, (numbers.Real, np.number))
          and not isinstance(value, (bool, np.bool_)))


def value_problem(value: Any, annotation: Any = None, default: Any = None,
                  choices: Iterable[Any] | None = None) -> str | None:
  """Why `value` does not fit a hyperparameter, or None when it does.

  The hyperparameter is described by its type `annotation` (from the signature: `int`,
  `float`, `bool`, `str`, `Literal[...]`, `X | None`, `ArrayLike`, `tuple[...]`) or, where
  it has none, by the type of its `default` (a None default accepts anything); `choices`
  gives the valid values of a string annotated as a plain `str`. Numbers must not be NaN.

  Returns:
    A phrase to put after the name, e.g. "must be one of ['group', 'batch', 'none'] (did
    you mean 'group'?)" or "must be a number, got str 'abc'"; None when the value fits.
  """
  if _is_number(value) and math.isnan(float(value)):
    return "must be a number, got NaN"
  if choices is not None:
    choices = tuple(choices)
    if value in choices:
      return None
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"must be one of {list(choices)}{hint}"
  if annotation is None or annotation is Any:
    if default is None or default is inspect.Parameter.empty:
      return None
    annotation = type(default)
  origin = typing.get_origin(annotation)
  if origin is typing.Literal:
    return value_problem(value, choices=typing.get_args(annotation))
  if origin in (typing.Union, types.UnionType):
    options = typing.get_args(annotation)
    if value is None:
      return None if type(None) in options else "must not be None"
    fits = {o: _fits(value, o) for o in options if o is not type(None)}
    if any(f is not False for f in fits.values()):
      return None  # fits one of them, or one is a type this check does not know
    for o in fits:  # a choice among strings says which
      if typing.get_origin(o) is typing.Literal:
        return value_problem(value, o)
    if any(o is np.ndarray or "Array" in _type_name(o) for o in fits):
      return f"must be a number or an array, got {_describe(value)}"  # ArrayLike
    return (f"must be {' or '.join(_type_name(o) for o in options)}, "
            f"got {_describe(value)}")
  ok = _fits(value, annotation)
  return None if ok is not False else (
      f"must be {_type_name(annotation)}, got {_describe(value)}")


def _fits(value: Any, annotation: Any) -> bool | None:
  """Whether `value` is of the (non-union) type `annotation`; None for a type this check
  does not know (the function decides)."""
  origin = typing.get_origin(annotation)
  if origin is typing.Literal:
    return value in typing.get_args(annotation)
  if origin in (typing.Union, types.UnionType):
    return value_problem(value, annotation) is None
  if origin in (tuple, list) or annotation in (tuple, list):
    return isinstance(value, (tuple, list))
  if annotation is bool:
    return isinstance(value, (bool, np.bool_))
  if annotation is int:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
  if annotation in (float, complex):
    return _is_number(value)
  if annotation is str:
    return isinstance(value, str)
  if annotation in (np.ndarray, np.number, np.bool_) or "Array" in _type_name(annotation):
    return not isinstance(value, str) and value is not None  # numbers and arrays
  return None

def hyperparameter_hints(*fns: Any) -> dict[str, Any]:
  """{argument: annotation} of `fns` merged (later ones fill what earlier ones lack); a
  function whose annotations do not resolve contributes nothing."""
  out: dict[str, Any] = {}
  for fn in fns:
    try:
      hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable forward references: no hints
      hints = {}
    for k, v in hints.items():
      out.setdefault(k, v)
  return out


def check_hyperparameters(what: str, fn: Any, values: Mapping[str, Any], *,
                          valid: Iterable[str] | None = None,
                          choices: Mapping[str, Iterable[Any]] | None = None,
                          hint_fns: Iterable[Any] = ()) -> None:
  """Checks keyword hyperparameters `values` of `fn` eagerly: known names (close matches
  offered), types and string choices from the signature (`value_problem`).

  Args:
    what: how errors name the callee, e.g. "estimator 'grpo'".
    fn: the function whose signature describes the hyperparameters.
    values: {name: value} to check.
    valid: the names accepted (default: every keyword parameter of `fn`).
    choices: {name: valid values} for strings annotated as a plain `str`.
    hint_fns: further functions whose annotations describe parameters `fn` passes on.

  Raises:
    UnknownNameError: a name `fn` does not take.
    ValueError: a value of the wrong type, not one of its choices, or NaN; the message
      names the argument.
  """
  params = inspect.signature(fn).parameters
  valid = tuple(valid) if valid is not None else tuple(params)
  hints = hyperparameter_hints(fn, *hint_fns)
  choices = dict(choices or {})
  for name, value in values.items():
    if name not in valid:
      raise unknown(f"{what} argument", name, valid)
    default = params[name].default if name in params else None
    problem = value_problem(value, hints.get(name), default, choices.get(name))
    if problem:
      raise ValueError(f"{what}: {name}={value!r} {problem}")
