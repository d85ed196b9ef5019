"""Name -> spec registries for advantage estimators and policy losses.

A method registers itself where it is defined, with the contract fields it needs, its
paper, its provenance (`confidence` and `source`) and (for stateful estimators) how to
build its state::

    @register_estimator("grpo", needs=("reward", "group_id", "response_mask"), paper=...,
                        confidence="code-verified", source=...,
                        static_argnames=("num_groups", "group_size", "scale", "singleton"))
    def grpo_advantages(*, reward, group_id, response_mask, num_groups, ...): ...

Provenance is given, never derived: `confidence` is one of `CONFIDENCE_TAGS`
("code-verified": checked against the authors' code or a reference implementation;
"paper-equation": the paper's equations; "inferred": reconstructed from the paper's text
where it gives no equation) and `source` names what was read (the paper's title and arXiv
id, and for "code-verified" the repository, with its commit where it was recorded, as
``code: owner/repo@commit path``). Registration without them fails, naming the method.

What the registry derives instead of being told:

* the family, from the defining module: `credit/advantages/<family>/<name>.py` is family
  `<family>` (one of `FAMILIES`); a function defined outside `credit.advantages` (a
  user's own estimator) is family "user";
* the data arguments and hyperparameters, from the signature (computed once): `needs` must
  be contract fields (`credit.contract.CONTRACT`) the function takes as keywords.

Lookups of unknown names raise `UnknownNameError` listing the known names.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Iterable, Mapping

from credit._checks import UnknownNameError, check_hyperparameters, unknown
from credit.contract import CONTRACT, validate_fields

__all__ = [
    "FAMILIES", "CONFIDENCE_TAGS", "EstimatorSpec", "PolicyLossSpec", "TrainedLoss",
    "UnknownNameError",
    "register_estimator", "register_policy_loss", "get_estimator", "list_estimators",
    "list_families", "get_policy_loss", "list_policy_losses",
]

# Estimator families, one package each under credit/advantages/.
FAMILIES = ("outcome", "token", "implicit", "turn", "distill", "tree", "shaping")
CONFIDENCE_TAGS = ("code-verified", "paper-equation", "inferred")
_USER = "user"
_ADV_PREFIX = "credit.advantages."

# Arguments the runner supplies from the batch layout rather than from fields.
_LAYOUT_ARGS = ("num_groups", "group_size")


def _family_of(fn: Callable) -> str:
  mod = getattr(fn, "__module__", "") or ""
  if not mod.startswith(_ADV_PREFIX):
    return _USER
  family = mod[len(_ADV_PREFIX):].split(".")[0]
  if family not in FAMILIES:
    raise ValueError(f"estimator module {mod!r} is not inside a family package "
                     f"credit/advantages/<family>/ with family in {list(FAMILIES)}")
  return family


def _check_needs(kind: str, name: str, fn: Callable, needs: Iterable[str],
                 params: Mapping[str, inspect.Parameter]) -> None:
  bad = sorted(n for n in needs if n not in CONTRACT)
  if bad:
    raise ValueError(f"{kind} {name!r} needs {bad}, which are not contract fields; add them to "
                     f"credit.contract.CONTRACT (known: {sorted(CONTRACT)})")
  missing = sorted(n for n in needs if n not in params)
  if missing:
    raise ValueError(f"{kind} {name!r}: {fn.__qualname__} takes no argument(s) {missing} "
                     "that it declares in `needs`")


def _check_call(kind: str, name: str, fn: Callable, params: tuple[str, ...],
                hyperparameters: tuple[str, ...], needs: Iterable[str],
                kwargs: Mapping[str, Any], hint_fns: tuple = ()) -> None:
  """The eager checks of a `validate=True` call: argument names, the needed fields, the
  hyperparameters' types and string choices, and the contract fields' shapes, dtypes,
  finiteness and group ids (`validate_fields`). Errors name the argument."""
  what = f"{kind} {name!r}"
  for k in kwargs:
    if k not in params:
      raise unknown(f"{what} argument", k, params)
  missing = sorted(set(needs) - set(kwargs))
  if missing:
    raise TypeError(f"{what}: missing field(s) {missing}")
  check_hyperparameters(what, fn, {k: v for k, v in kwargs.items() if k in hyperparameters},
                        hint_fns=hint_fns)
  validate_fields({k: v for k, v in kwargs.items() if k in CONTRACT},
                  num_groups=kwargs.get("num_groups"), where=what)


_CODE_REF = re.compile(r"\bcode: [\w.-]+/[\w.-]+")


def _provenance(kind: str, name: str, confidence: str | None,
                source: str | None) -> tuple[str, str]:
  """Checks the `confidence` and `source` of a registration; errors name the method."""
  missing = [a for a, v in (("confidence", confidence), ("source", source)) if v is None]
  if missing:
    raise ValueError(f"{kind} {name!r}: register it with {' and '.join(m + '=' for m in missing)} "
                     f"(confidence: one of {list(CONFIDENCE_TAGS)}; source: the paper's title "
                     "and arXiv id, plus 'code: owner/repo@commit path' where code was read)")
  if confidence not in CONFIDENCE_TAGS:
    raise ValueError(f"{kind} {name!r}: confidence={confidence!r} is not one of "
                     f"{list(CONFIDENCE_TAGS)}")
  if not isinstance(source, str) or not source.strip():
    raise ValueError(f"{kind} {name!r}: source must be a non-empty string naming what was "
                     f"read, got {source!r}")
  if confidence == "code-verified" and not _CODE_REF.search(source):
    raise ValueError(f"{kind} {name!r}: a code-verified source must name the code it was "
                     f"checked against as 'code: owner/repo[@commit] [path]', got {source!r}")
  return confidence, " ".join(source.split())


# The scores a trained loss can take from the update's own model pass (`TrainedLoss.scores`),
# each with the contract fields the runner needs to compute it: `logprob` from the rollout's
# tokens; `logprob_answer` by teacher-forcing `answer_tokens` (prompt ⊕ response ⊕ reference
# answer) and reading the log-probs at `answer_positions`.
TRAINED_SCORES: dict[str, tuple[str, ...]] = {
    "logprob": (),
    "logprob_answer": ("answer_tokens", "answer_attn_mask", "answer_positions"),
}


@dataclasses.dataclass(frozen=True)
class TrainedLoss:
  """A term an estimator adds to the RL objective, differentiable in the policy's current
  log-probs (VIMPO's terminal-value loss, the only place its reward enters; VeriFree's and
  JEPO's weighted likelihood of the reference answer).

  Attributes:
    fn: `fn(*, <scores>, <fields>, <targets>, <params>) -> scalar`, called on every
      minibatch with the scores of the update's own model pass.
    fields: contract fields it reads from the batch.
    targets: per-row fields of the estimator's output (computed once over the whole batch,
      e.g. a group-centred reward) that it reads as batch arrays.
    params: the estimator's hyperparameters it shares, passed with the run's values (the
      estimator's defaults where the run sets none).
    coef: its default weight against the policy loss.
    optional_fields: (field, switch) pairs as `EstimatorSpec.optional_needs`.
    scores: what it differentiates, recomputed by the update under the current parameters
      (keys of `TRAINED_SCORES`): `logprob` (the sampled tokens), `logprob_answer` (the
      reference answer after prompt ⊕ response).
  """
  fn: Callable[..., Any]
  fields: tuple[str, ...]
  targets: tuple[str, ...]
  params: tuple[str, ...]
  coef: float
  optional_fields: tuple[tuple[str, str], ...] = ()
  scores: tuple[str, ...] = ("logprob",)

  @property
  def score_inputs(self) -> tuple[str, ...]:
    """The contract fields the update needs to compute `scores`."""
    return tuple(f for s in self.scores for f in TRAINED_SCORES[s])

  def fields_for(self, hyper: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """`fields` plus the optional ones switched on by the hyperparameters in `hyper`."""
    hyper = hyper or {}
    return tuple(sorted(set(self.fields)
                        | {f for f, switch in self.optional_fields if hyper.get(switch)}))

  def kwargs_for(self, estimator: Callable[..., Any],
                 hyper: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Its `params` as a run sets them in `hyper`, else the estimator function's defaults."""
    hyper, sig = hyper or {}, inspect.signature(estimator).parameters
    return {p: hyper[p] if p in hyper else sig[p].default for p in self.params}


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
  """A registered advantage estimator.

  Attributes:
    name: registry key.
    fn: the pure function; keyword-only data arguments named by the contract.
    needs: contract fields the function always takes as data.
    paper: citation (title, arXiv id).
    family: derived from the defining package (`FAMILIES`, or "user").
    confidence: "code-verified" | "paper-equation" | "inferred", as registered.
    source: what the implementation was written from, as registered: the paper and, for
      "code-verified", the code (``code: owner/repo@commit path``).
    static_argnames: hyperparameters that change shapes/control flow (jit static).
    returns_output: True when it returns a NamedTuple with an `advantages` field.
    optional_needs: (field, switch) pairs for inputs the function takes only in some settings:
      `field` is needed when the hyperparameter `switch` is truthy, its value in the run's
      hyperparameters or else its default (REINFORCE++ takes `logprob_ref` when `kl_coef`
      != 0; VeriFree takes `format_ok` unless `format_gate=False`). `needs_for(hyper)`
      resolves them.
    init_state: for stateful estimators, `init_state(num_prompts) -> state`; the function
      then takes `state=` and returns a NamedTuple with `advantages` and `state`.
    params: the function's keyword parameters (from its signature, computed once).
    trained_loss: a term the estimator adds to the RL objective (`TrainedLoss`), or None.
  """
  name: str
  fn: Callable[..., Any]
  needs: frozenset[str]
  paper: str
  family: str
  confidence: str
  source: str = ""
  static_argnames: tuple[str, ...] = ()
  returns_output: bool = False
  optional_needs: tuple[tuple[str, str], ...] = ()
  init_state: Callable[[int], Any] | None = None
  params: tuple[str, ...] = ()
  trained_loss: TrainedLoss | None = None

  @property
  def stateful(self) -> bool:
    return self.init_state is not None

  @property
  def module(self) -> str:
    return self.fn.__module__

  @property
  def hyperparameters(self) -> tuple[str, ...]:
    """Keyword parameters that are neither contract data nor layout/state arguments."""
    return tuple(p for p in self.params if p not in CONTRACT and p not in _LAYOUT_ARGS
                 and p != "state")

  def needs_for(self, hyper: Mapping[str, Any] | None = None) -> frozenset[str]:
    """`needs` plus the optional inputs switched on by the hyperparameters in `hyper` (a
    switch not in `hyper` takes the function's default)."""
    hyper = hyper or {}
    params = _keyword_params(self.fn) if self.optional_needs else {}

    def on(switch):
      if switch in hyper:
        return bool(hyper[switch])
      default = params[switch].default
      return default is not inspect.Parameter.empty and bool(default)

    return self.needs | {f for f, switch in self.optional_needs if on(switch)}

  def split_arguments(self, hyper: Mapping[str, Any] | None = None, *,
                      num_groups: int | None = None,
                      group_size: int | None = None) -> tuple[tuple[str, ...], dict]:
    """(data argument names, static keyword arguments) for a call with `hyper`.

    Layout arguments (`num_groups`, `group_size`) are added when the function takes them;
    lists become tuples (hashable). Raises ValueError naming the valid hyperparameters
    for one the function does not take.
    """
    hyper = dict(hyper or {})
    for k in hyper:
      if k not in self.params or k in CONTRACT or k in _LAYOUT_ARGS or k == "state":
        raise ValueError(f"estimator {self.name!r} has no hyperparameter {k!r}; valid: "
                         f"{list(self.hyperparameters)}")
    static = {k: tuple(v) if isinstance(v, list) else v for k, v in hyper.items()}
    if "num_groups" in self.params:
      static["num_groups"] = num_groups
    if "group_size" in self.params:
      static["group_size"] = group_size
    data = tuple(sorted(n for n in self.needs_for(hyper) if n in self.params))
    return data, static

  def advantages(self, out: Any) -> Any:
    """The [B,T] advantages of whatever `fn` returned."""
    return out.advantages if (self.returns_output or self.stateful) else out

  def __call__(self, *, validate: bool = False, **kwargs: Any) -> Any:
    """`fn(**kwargs)`: the estimator called by its registry name.

    With `validate=True` (research code, eager inputs only) the call is checked first and
    refused in one line naming the argument: an argument `fn` does not take (with close
    matches), a missing field of `needs`, a hyperparameter of the wrong type or not one of
    its string choices (from the signature), and the contract fields' shapes, dtypes,
    NaN/inf and group ids in [0, num_groups) (`credit.validate_fields`). Under jit leave it
    False (the checks need concrete arrays).

    Example::

      spec = credit.get_estimator("grpo")
      adv = spec(reward=r, group_id=g, response_mask=m, num_groups=2, validate=True)
    """
    if validate:
      _check_call("estimator", self.name, self.fn, self.params, self.hyperparameters,
                  self.needs_for({k: v for k, v in kwargs.items()
                                  if k in self.hyperparameters}), kwargs)
    return self.fn(**kwargs)


@dataclasses.dataclass(frozen=True)
class PolicyLossSpec:
  """A registered policy loss.

  Attributes:
    name: registry key (`--config.policy_loss`).
    fn: the full loss, `fn(*, logprob, logprob_old, advantages, response_mask, <hyper>,
      <reduction arguments>) -> LossOutput(loss, metrics)`.
    token_fn: the per-token term, `token_fn(*, <needs>, <hyper>) -> TokenLoss(loss [B,T],
      metrics)`; `fn` is `token_fn` followed by `credit.losses.reduce_policy_loss`.
    needs: contract fields the loss takes as data.
    paper: citation.
    confidence: "code-verified" | "paper-equation" | "inferred", as registered.
    source: what the implementation was written from, as registered (see `EstimatorSpec`).
    static_argnames: arguments that change shapes/control flow (jit static).
    batch_coupled: the per-token value depends on statistics of the whole (micro-)batch
      (e.g. covariance top-k selection), so micro-batch sums differ from the full batch.
    whole_groups: the per-token value depends on statistics of each prompt group (`group_id`),
      so every minibatch must hold whole groups; the runner then shuffles groups, not rows
      (`experiments/train.py` `make_minibatch_sgd(group_size=...)`). Static config.
    params: the full function's keyword parameters.
  """
  name: str
  fn: Callable[..., Any]
  token_fn: Callable[..., Any]
  needs: frozenset[str]
  paper: str
  confidence: str
  source: str = ""
  static_argnames: tuple[str, ...] = ()
  batch_coupled: bool = False
  whole_groups: bool = False
  params: tuple[str, ...] = ()

  @property
  def module(self) -> str:
    return self.token_fn.__module__

  @property
  def hyperparameters(self) -> tuple[str, ...]:
    return tuple(p for p in self.params if p not in CONTRACT)

  def __call__(self, *, validate: bool = False, **kwargs: Any) -> Any:
    """`fn(**kwargs)`: the loss called by its registry name; `validate=True` checks the
    call first, as `EstimatorSpec.__call__` does."""
    if validate:
      _check_call("policy loss", self.name, self.fn, self.params, self.hyperparameters,
                  self.needs, kwargs, hint_fns=(self.token_fn,))
    return self.fn(**kwargs)


_ESTIMATORS: dict[str, EstimatorSpec] = {}
_POLICY_LOSSES: dict[str, PolicyLossSpec] = {}


def _check_unique(kind: str, name: str, fn, table: dict) -> None:
  """Two different functions may not share a name; the same function registered again (its
  module re-imported, e.g. by a doctest runner or importlib.reload) replaces its entry."""
  old = table.get(name)
  if old is None:
    return
  old_fn = getattr(old, "token_fn", old.fn)
  if (old_fn.__module__, old_fn.__qualname__) != (fn.__module__, fn.__qualname__):
    raise ValueError(f"{kind} {name!r} registered twice: {old_fn.__module__}."
                     f"{old_fn.__qualname__} and {fn.__module__}.{fn.__qualname__}")


def _keyword_params(fn: Callable) -> dict[str, inspect.Parameter]:
  return {k: p for k, p in inspect.signature(fn).parameters.items()
          if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def register_estimator(name: str, *, needs: Iterable[str], paper: str,
                       confidence: str | None = None, source: str | None = None,
                       static_argnames: Iterable[str] = (), returns_output: bool = False,
                       optional_needs: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                       init_state: Callable[[int], Any] | None = None,
                       trained_loss: TrainedLoss | None = None):
  """Decorator registering an estimator under `name` (names are unique).

  Args:
    name: registry key.
    needs: contract fields the function always takes.
    paper: citation (title, arXiv id where one exists).
    confidence: required; one of `CONFIDENCE_TAGS`.
    source: required; what was read: the paper (title, arXiv id) and, where code was
      read, ``code: owner/repo@commit path`` (required for "code-verified").
    static_argnames: arguments that change shapes or control flow.
    returns_output: the function returns a NamedTuple with `advantages`.
    optional_needs: {field: switching hyperparameter}, see `EstimatorSpec`.
    init_state: `init_state(num_prompts) -> state` for stateful estimators.
    trained_loss: a term added to the RL objective (`TrainedLoss`); the function must then
      return a NamedTuple (`returns_output`) with its `targets`.
  """
  opt = tuple(sorted(dict(optional_needs).items()))
  if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
    raise ValueError(f"estimator name {name!r}: use lower_snake_case")
  confidence, source = _provenance("estimator", name, confidence, source)

  def deco(fn):
    params = _keyword_params(fn)
    _check_needs("estimator", name, fn, list(needs) + [f for f, _ in opt], params)
    if init_state is not None and "state" not in params:
      raise ValueError(f"estimator {name!r} has init_state but {fn.__qualname__} takes no "
                       "`state` argument")
    if trained_loss is not None:
      loss_params = _keyword_params(trained_loss.fn)
      bad = [p for p in trained_loss.params if p not in params or p not in loss_params]
      scores = trained_loss.scores
      if (bad or not returns_output or not scores
          or any(s not in TRAINED_SCORES or s not in loss_params for s in scores)):
        raise ValueError(f"estimator {name!r}: its trained_loss must take its scores "
                         f"{list(scores)} (some of {list(TRAINED_SCORES)}) and "
                         f"hyperparameters of the estimator (not {bad}), and the estimator "
                         "must return a NamedTuple with the loss's targets (returns_output)")
    _check_unique("estimator", name, fn, _ESTIMATORS)
    _ESTIMATORS[name] = EstimatorSpec(
        name=name, fn=fn, needs=frozenset(needs), paper=paper, family=_family_of(fn),
        confidence=confidence, source=source,
        static_argnames=tuple(static_argnames), returns_output=returns_output,
        optional_needs=opt, init_state=init_state, params=tuple(params),
        trained_loss=trained_loss)
    return fn

  return deco


def register_policy_loss(name: str, *, needs: Iterable[str], paper: str,
                         confidence: str | None = None, source: str | None = None,
                         static_argnames: Iterable[str] = (), batch_coupled: bool = False,
                         whole_groups: bool = False,
                         token_fn: Callable[..., Any] | None = None):
  """Decorator registering a full policy loss `fn` (and its per-token term `token_fn`).

  `credit.losses` builds `fn` from a per-token function and the shared reduction; a user
  may register any function with the `fn` signature (then `token_fn` defaults to `fn`).
  `whole_groups`: see `PolicyLossSpec`; such a loss must take `group_id`.
  `confidence` and `source` are required, as for `register_estimator`.
  """
  confidence, source = _provenance("policy loss", name, confidence, source)

  def deco(fn):
    tfn = token_fn or fn
    params = _keyword_params(fn)
    _check_needs("policy loss", name, fn, needs, params)
    if whole_groups and "group_id" not in needs:
      raise ValueError(f"policy loss {name!r} declares whole_groups but does not need group_id")
    _check_unique("policy loss", name, tfn, _POLICY_LOSSES)
    _POLICY_LOSSES[name] = PolicyLossSpec(
        name=name, fn=fn, token_fn=tfn, needs=frozenset(needs), paper=paper,
        confidence=confidence, source=source,
        static_argnames=tuple(static_argnames), batch_coupled=batch_coupled,
        whole_groups=bool(whole_groups), params=tuple(params))
    return fn

  return deco


def get_estimator(name: str) -> EstimatorSpec:
  """The spec registered under `name`; raises `UnknownNameError` listing known names."""
  try:
    return _ESTIMATORS[name]
  except (KeyError, TypeError):
    raise unknown("estimator", name, _ESTIMATORS) from None


def list_estimators(family: str | None = None) -> list[str]:
  """Registered estimator names (of one family when given), sorted."""
  if family is not None and family not in FAMILIES + (_USER,):
    raise unknown("family", family, FAMILIES + (_USER,))
  return sorted(n for n, s in _ESTIMATORS.items() if family is None or s.family == family)


def list_families() -> dict[str, list[str]]:
  """{family: [estimator names]} for every family package (empty ones included)."""
  out = {f: list_estimators(f) for f in FAMILIES}
  user = list_estimators(_USER)
  if user:
    out[_USER] = user
  return out


def get_policy_loss(name: str) -> PolicyLossSpec:
  try:
    return _POLICY_LOSSES[name]
  except (KeyError, TypeError):
    raise unknown("policy loss", name, _POLICY_LOSSES) from None


def list_policy_losses() -> list[str]:
  return sorted(_POLICY_LOSSES)
