"""Name -> function registries for advantage estimators and policy losses.

The runner picks a method by name and reads from its spec which rollout
fields and extra passes it needs. Lookups of unknown names raise with the list
of known names. Registration happens at import of each family module.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Mapping

# Names of inputs that are not plain rollout fields but require work from the
# runner: extra forward passes or samples.
EXTRA_PASSES = frozenset({
    "logprob_ref",          # forward pass of the frozen reference model
    "logprob_teacher",      # forward pass of a teacher model
    "rescore_under_context",  # re-score the sampled tokens under another context
    "branch_samples",       # continuations from shared prefixes
    "values",               # a critic
})


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
  """A registered advantage estimator.

  Attributes:
    name: registry key.
    fn: the pure function; keyword-only data arguments named by the contract.
    needs: rollout fields (and extra passes) the function takes as data.
    paper: citation (title, arXiv id) for the docstring and reports.
    family: "outcome", "token", "implicit", "turn", "distill", "tree".
    static_argnames: hyperparameters that change shapes/control flow (jit static).
    stateful: True when the function takes and returns explicit estimator state.
    returns_output: True when it returns a NamedTuple with an `advantages` field.
    optional_needs: (field, switch) pairs for inputs the function takes only in some settings:
      `field` is needed when the hyperparameter `switch` is set to a truthy value (e.g.
      REINFORCE++ takes `logprob_ref` when `kl_coef` != 0). `needs_for(hyper)` resolves them.
  """
  name: str
  fn: Callable[..., Any]
  needs: frozenset[str]
  paper: str
  family: str = "outcome"
  static_argnames: tuple[str, ...] = ()
  stateful: bool = False
  returns_output: bool = False
  optional_needs: tuple[tuple[str, str], ...] = ()

  def needs_for(self, hyper: Mapping[str, Any] | None = None) -> frozenset[str]:
    """`needs` plus the optional inputs switched on by the hyperparameters in `hyper`."""
    hyper = hyper or {}
    return self.needs | {f for f, switch in self.optional_needs if hyper.get(switch)}


@dataclasses.dataclass(frozen=True)
class PolicyLossSpec:
  """A registered policy loss: fn(*, logprob, logprob_old, advantages, response_mask, ...)

  returns a `LossOutput(loss, metrics)`; `needs` lists the contract fields it uses.
  """
  name: str
  fn: Callable[..., Any]
  needs: frozenset[str]
  paper: str
  static_argnames: tuple[str, ...] = ()


_ESTIMATORS: dict[str, EstimatorSpec] = {}
_POLICY_LOSSES: dict[str, PolicyLossSpec] = {}


class UnknownNameError(KeyError):
  """An unknown estimator or loss name; the message lists the known ones."""

  def __str__(self) -> str:  # KeyError quotes its message otherwise
    return str(self.args[0])


def _unknown(kind: str, name: str, known: dict) -> UnknownNameError:
  close = difflib.get_close_matches(name, list(known), n=3)
  hint = f" Did you mean {close}?" if close else ""
  return UnknownNameError(f"Unknown {kind} {name!r}.{hint} Known {kind}s: {sorted(known)}")


def _check_unique(kind: str, name: str, fn, table: dict) -> None:
  """Two different functions may not share a name; the same function registered again (its
  module re-imported, e.g. by a doctest runner or importlib.reload) replaces its entry."""
  old = table.get(name)
  if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__,
                                                                     fn.__qualname__):
    raise ValueError(f"{kind} {name!r} registered twice: {old.fn.__module__}."
                     f"{old.fn.__qualname__} and {fn.__module__}.{fn.__qualname__}")


def register_estimator(name: str, *, needs, paper: str, family: str = "outcome",
                       static_argnames=(), stateful: bool = False,
                       returns_output: bool = False, optional_needs=()):
  """Decorator registering `fn` under `name` (names must be unique).

  `optional_needs`: a {field: switch} mapping or (field, switch) pairs, see `EstimatorSpec`.
  """
  opt = tuple(sorted(dict(optional_needs).items()))

  def deco(fn):
    _check_unique("estimator", name, fn, _ESTIMATORS)
    _ESTIMATORS[name] = EstimatorSpec(name, fn, frozenset(needs), paper, family,
                                      tuple(static_argnames), stateful, returns_output, opt)
    return fn

  return deco


def register_policy_loss(name: str, *, needs, paper: str, static_argnames=()):
  def deco(fn):
    _check_unique("policy loss", name, fn, _POLICY_LOSSES)
    _POLICY_LOSSES[name] = PolicyLossSpec(name, fn, frozenset(needs), paper,
                                          tuple(static_argnames))
    return fn

  return deco


def get_estimator(name: str) -> EstimatorSpec:
  """The spec registered under `name`; raises `UnknownNameError` listing known names."""
  try:
    return _ESTIMATORS[name]
  except KeyError:
    raise _unknown("estimator", name, _ESTIMATORS) from None


def list_estimators(family: str | None = None) -> list[str]:
  return sorted(n for n, s in _ESTIMATORS.items() if family is None or s.family == family)


def get_policy_loss(name: str) -> PolicyLossSpec:
  try:
    return _POLICY_LOSSES[name]
  except KeyError:
    raise _unknown("policy loss", name, _POLICY_LOSSES) from None


def list_policy_losses() -> list[str]:
  return sorted(_POLICY_LOSSES)
