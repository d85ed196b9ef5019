"""Multi-turn environments (host side): the episode interface, limits, batches of episodes.

An episode alternates policy turns and environment observations:

  prompt = env.reset()
  turn 0: the policy writes action_0 (text, up to its end-of-sequence token);
          env.step(action_0) -> StepResult(observation_0, done, reward_0, progress_0, role_0, info)
  turn 1: the policy continues after prompt + action_0 + observation_0 ... until `done`.

A rollout engine samples B such episodes at once (`EnvBatch`) and maps what the environment
reports per turn onto the rollout contract (`credit/contract.py`):

  StepResult.reward    -> step_reward[b, k]    the turn's own (process) reward
  StepResult.progress  -> turn_progress[b, k]  verifiable progress in [0, 1] AFTER turn k
                                               (0 before the first turn)
  StepResult.role      -> turn_role[b, k]      who played the turn
  env.outcome()        -> reward[b]            the final reward in [0, 1]
  turn k took place    -> step_mask[b, k]

`EnvBatch.turn_fields(K)` builds those `[B, K]` arrays. Environments are deterministic
given their example, keep their state in a small immutable value (so `snapshot` is a cheap
reference and `restore` re-rolls several continuations from one intermediate state), and
never raise on what the policy writes: an unreadable action is an "error: ..." observation.
They raise only on misuse: `step` before `reset`, or on a finished episode
(`EpisodeDoneError`).

`Limits` carries the episode limits: `max_turns` and `max_observation_chars` are enforced
here (after `max_turns` turns the episode is done; a longer observation is cut and ends in
`truncation_marker`), the token limits are carried for the engine.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from credit.envs.tools import ANSWER, MALFORMED, Action, ToolFormat, parse_action
from credit.tasks.base import as_example

_EMPTY_INFO = types.MappingProxyType({})


class StepResult(NamedTuple):
  """What one policy turn produced.

  Attributes:
    observation: text appended after the turn ("" when the episode is done).
    done: the episode is over (answered, or `max_turns` turns taken).
    reward: the turn's own reward (-> `step_reward[b, k]`).
    progress: verifiable task progress in [0, 1] after this turn (-> `turn_progress[b, k]`).
    role: who played the turn (-> `turn_role[b, k]`).
    info: the parsed `action`, `tool`, `valid` (a well-formed call or answer), `error`,
      `correct`, `truncated` (the observation was cut) and task-specific entries (revealed
      facts, the gold call(s) of the state the turn was played in, ...).
  """
  observation: str
  done: bool
  reward: float
  progress: float
  role: int = 0
  info: Mapping[str, Any] = _EMPTY_INFO


class EpisodeDoneError(RuntimeError):
  """`step` on an episode that is already over."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Episode limits.

  Attributes:
    max_turns: policy turns per episode; the episode is done after this many.
    max_observation_chars: longer observations are cut to this many characters, the last
      ones being `truncation_marker` (None: no limit).
    max_action_tokens, max_observation_tokens, max_total_tokens: token limits the rollout
      engine enforces (None: its own defaults); carried here only.
    truncation_marker: the visible end of a cut observation.
  """
  max_turns: int = 4
  max_observation_chars: int | None = None
  max_action_tokens: int | None = None
  max_observation_tokens: int | None = None
  max_total_tokens: int | None = None
  truncation_marker: str = "..."

  def __post_init__(self):
    if self.max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
    for name in ("max_observation_chars", "max_action_tokens", "max_observation_tokens",
                 "max_total_tokens"):
      v = getattr(self, name)
      if v is not None and v < 1:
        raise ValueError(f"{name} must be >= 1 or None, got {v}")

  def truncate(self, text: str) -> str:
    """`text` cut to `max_observation_chars`, ending in the marker when cut."""
    n = self.max_observation_chars
    if n is None or len(text) <= n:
      return text
    keep = max(n - len(self.truncation_marker), 0)
    return (text[:keep] + self.truncation_marker)[:n]


class Environment(Protocol):
  """One episode (see module docstring)."""
  limits: Limits
  gold_answer: str | None  # a correct final answer turn's text, when the task knows it

  def reset(self) -> str:
    """Starts (or restarts) the episode; returns the prompt text."""

  def step(self, action: str) -> StepResult:
    """Plays one policy turn; raises `EpisodeDoneError` when the episode is over."""

  def outcome(self) -> float:
    """The final reward in [0, 1]; 0 while unanswered."""

  def snapshot(self) -> Any:
    """The episode state (cheap, immutable)."""

  def restore(self, snap: Any) -> None:
    """Returns to a `snapshot`."""

  @property
  def num_turns(self) -> int:
    """Turns played so far."""

  @property
  def done(self) -> bool: ...


class MultiTurnTask(Protocol):
  """A multi-turn task: the Task protocol of `credit.tasks.base` plus environments.

  `verify(example, response)` scores a final answer turn's text (e.g. "answer(bob)") and
  `demonstration(example)` returns one; `demonstration_turns(example)` is the whole list
  of actions of a correct episode (its last element is `demonstration(example)`); the
  example's `answer` is the gold value alone ("bob").
  """
  name: str
  multi_turn: bool  # True
  # Turns are tool-call actions parsed by `credit.envs.tools` (`TextEnv`): each step's info
  # holds the parsed `action`, which the runner's tool-usage fields (tool calls, tool cost) count.
  tool_actions: bool
  int_fields: dict[str, tuple[int, ...]]
  max_prompt_chars: int
  max_response_chars: int  # the longest action
  max_turns: int
  max_action_chars: int
  max_observation_chars: int

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]: ...

  def verify(self, example: Mapping[str, Any], response: str) -> float: ...

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str: ...

  def demonstration_turns(self, example: Mapping[str, Any],
                          rng: np.random.Generator | None = None) -> list[str]: ...

  def make_env(self, example: Mapping[str, Any], limits: Limits | None = None) -> Environment: ...


def task_limits(task: Any, limits: Limits | None = None) -> Limits:
  """`limits`, or the task's defaults (`max_turns`, `max_observation_chars`)."""
  if limits is not None:
    return limits
  return Limits(max_turns=task.max_turns, max_observation_chars=task.max_observation_chars)


class _Episode(NamedTuple):
  """The bookkeeping every `TextEnv` shares, plus the task's own immutable `state`."""
  started: bool
  turns: int
  done: bool
  outcome: float
  first_error: int
  state: Any


class TextEnv:
  """Shared episode bookkeeping for the built-in environments.

  A subclass sets `tools` (name -> arity) and `prompt`, and implements
  `_initial_state()`, `_progress(state)` and `_act(state, action) -> (state, Turn)`
  over an immutable `state`; this class parses actions, counts turns, enforces the
  limits, records the first incorrect turn and the outcome, and snapshots.
  """
  tools: Mapping[str, int | None] = {}
  prompt: str = ""
  gold_answer: str | None = None

  def __init__(self, limits: Limits, fmt: ToolFormat = ToolFormat()):
    self.limits, self.fmt = limits, fmt
    self._ep = _Episode(False, 0, False, 0.0, -1, None)

  # --- to implement --------------------------------------------------------------------
  def _initial_state(self) -> Any:
    raise NotImplementedError

  def _progress(self, state: Any) -> float:
    raise NotImplementedError

  def _act(self, state: Any, action: Action) -> tuple[Any, "Turn"]:
    raise NotImplementedError

  def _role(self, action: Action) -> int:
    del action
    return 0

  # --- the Environment interface ------------------------------------------------------
  def reset(self) -> str:
    self._ep = _Episode(True, 0, False, 0.0, -1, self._initial_state())
    return self.prompt

  def step(self, action: str) -> StepResult:
    ep = self._ep
    if not ep.started:
      raise RuntimeError(f"{type(self).__name__}.step before reset()")
    if ep.done:
      raise EpisodeDoneError(f"{type(self).__name__}: the episode is over after "
                             f"{ep.turns} turn(s); reset() or restore() first")
    parsed = parse_action(action, self.fmt, self.tools)
    if parsed.kind == MALFORMED:
      state, turn = ep.state, Turn(f"error: {parsed.error}", correct=False)
    else:
      state, turn = self._act(ep.state, parsed)
    k = ep.turns
    answered = parsed.kind == ANSWER
    done = answered or k + 1 >= self.limits.max_turns
    observation = "" if done else self.limits.truncate(turn.observation)
    first_error = k if (ep.first_error < 0 and not turn.correct) else ep.first_error
    outcome = turn.outcome if answered else ep.outcome
    self._ep = _Episode(True, k + 1, done, outcome, first_error, state)
    info = {"turn": k, "action": parsed, "tool": parsed.name, "valid": parsed.kind != MALFORMED,
            "error": parsed.error, "correct": turn.correct,
            "truncated": observation != turn.observation and not done, **turn.info}
    return StepResult(observation, done, float(turn.reward), float(self._progress(state)),
                      self._role(parsed), info)

  def outcome(self) -> float:
    return self._ep.outcome

  def snapshot(self) -> Any:
    return self._ep

  def restore(self, snap: Any) -> None:
    if not isinstance(snap, _Episode):
      raise TypeError(f"not a {type(self).__name__} snapshot: {type(snap).__name__}")
    self._ep = snap

  @property
  def num_turns(self) -> int:
    return self._ep.turns

  @property
  def done(self) -> bool:
    return self._ep.done

  @property
  def progress(self) -> float:
    """Progress so far (0 before the first turn)."""
    return float(self._progress(self._ep.state)) if self._ep.started else 0.0

  def first_error_turn(self) -> int:
    """The index of the first turn that was not correct (-1: none so far)."""
    return self._ep.first_error


class Turn(NamedTuple):
  """What a `TextEnv` subclass returns for one parsed action (before limits apply).

  `outcome` is read only for the answer turn; `correct` feeds `first_error_turn`.
  """
  observation: str
  reward: float = 0.0
  correct: bool = True
  outcome: float = 0.0
  info: Mapping[str, Any] = _EMPTY_INFO


class Episode(NamedTuple):
  """A played episode (`run_episode`)."""
  prompt: str
  actions: tuple[str, ...]
  results: tuple[StepResult, ...]
  outcome: float


def run_episode(env: Environment, actions: Sequence[str]) -> Episode:
  """Resets `env` and plays `actions` in order (e.g. a task's `demonstration_turns`).

  Raises:
    ValueError: the episode ended before the last action.
  """
  prompt = env.reset()
  results = []
  for i, a in enumerate(actions):
    if env.done:
      raise ValueError(f"the episode ended after {i} of {len(actions)} actions")
    results.append(env.step(a))
  return Episode(prompt, tuple(actions), tuple(results), float(env.outcome()))


def _rows(examples: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[dict]:
  if isinstance(examples, Mapping):  # a collated batch of columns
    keys = list(examples)
    b = len(examples[keys[0]]) if keys else 0
    return [as_example({k: examples[k][i] for k in keys}) for i in range(b)]
  return [as_example(e) for e in examples]


class EnvBatch:
  """B episodes stepped together (host side), e.g. N examples x G samples each.

  Rows of one example are contiguous (`group_id[b] = b // G`), the rollout layout.
  `step` takes one action per row; a row whose action is None, or whose episode is over,
  is skipped and gets None, so the engine may pass every row's decoded text each turn.
  Every row's results are kept (`results[b]`, in turn order) for `turn_fields`.
  """

  def __init__(self, envs: Sequence[Environment], group_size: int = 1):
    self.envs = list(envs)
    self.group_size = group_size
    self.results: list[list[StepResult]] = [[] for _ in self.envs]

  @classmethod
  def from_examples(cls, task: Any, examples: Sequence[Mapping[str, Any]] | Mapping[str, Any],
                    repeat: int = 1, limits: Limits | None = None) -> "EnvBatch":
    """`repeat` episodes of each example (a list of example dicts or a collated batch)."""
    if repeat < 1:
      raise ValueError(f"repeat must be >= 1, got {repeat}")
    envs = [task.make_env(e, limits) for e in _rows(examples) for _ in range(repeat)]
    return cls(envs, repeat)

  def __len__(self) -> int:
    return len(self.envs)

  @property
  def group_id(self) -> np.ndarray:
    """`[B] int32`: the example each row plays."""
    return (np.arange(len(self.envs)) // self.group_size).astype(np.int32)

  def reset(self) -> list[str]:
    self.results = [[] for _ in self.envs]
    return [env.reset() for env in self.envs]

  def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
    if len(actions) != len(self.envs):
      raise ValueError(f"{len(actions)} actions for {len(self.envs)} environments")
    out: list[StepResult | None] = []
    for b, (env, a) in enumerate(zip(self.envs, actions)):
      if a is None or env.done:
        out.append(None)
        continue
      res = env.step(a)
      self.results[b].append(res)
      out.append(res)
    return out

  @property
  def done(self) -> np.ndarray:
    """`[B] bool`: episodes that are over."""
    return np.asarray([env.done for env in self.envs], dtype=bool)

  @property
  def num_turns(self) -> np.ndarray:
    """`[B] int32`: turns played per row."""
    return np.asarray([env.num_turns for env in self.envs], dtype=np.int32)

  def outcomes(self) -> np.ndarray:
    """`[B] float32`: each episode's final reward (0 while unanswered)."""
    return np.asarray([env.outcome() for env in self.envs], dtype=np.float32)

  def snapshot(self) -> tuple:
    return tuple(env.snapshot() for env in self.envs), tuple(tuple(r) for r in self.results)

  def restore(self, snap: tuple) -> None:
    envs, results = snap
    if len(envs) != len(self.envs):
      raise ValueError(f"snapshot of {len(envs)} rows for {len(self.envs)} environments")
    for env, s in zip(self.envs, envs):
      env.restore(s)
    self.results = [list(r) for r in results]

  def turn_fields(self, num_turns: int | None = None) -> dict[str, np.ndarray]:
    """The per-turn contract fields `[B, K]` from the results so far.

    `step_mask` (turn k took place), `step_reward`, `turn_progress`, `turn_role`
    (0 where no turn), with K = `num_turns` (default: the most turns of a row; a row with
    more turns raises).
    """
    k_max = max((len(r) for r in self.results), default=0)
    k = k_max if num_turns is None else num_turns
    if k_max > k:
      raise ValueError(f"a row played {k_max} turns, more than num_turns={k}")
    b = len(self.envs)
    mask = np.zeros((b, k), bool)
    reward = np.zeros((b, k), np.float32)
    progress = np.zeros((b, k), np.float32)
    role = np.zeros((b, k), np.int32)
    for i, rs in enumerate(self.results):
      for j, r in enumerate(rs):
        mask[i, j], reward[i, j], progress[i, j], role[i, j] = True, r.reward, r.progress, r.role
    return {"step_mask": mask, "step_reward": reward, "turn_progress": progress,
            "turn_role": role}
