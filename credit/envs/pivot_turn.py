"""`pivot_turn`: a multi-turn bifurcation task — one turn of the episode decides the reward.

The multi-turn member of the credit benchmark's bifurcation tasks (`credit/tasks/bifurcation.py`;
issue 15, "a pivotal turn in a multi-turn episode"; the controlled bifurcation tasks the survey
"From Reasoning to Agentic: Credit Assignment in Reinforcement Learning for Large Language
Models", arXiv:2604.09459, asks for). The environment asks K questions over K turns, one per
turn; the prompt says which turn counts:

  prompt "1;0:4="     the pivotal turn is 1; question 0 is the digit 4
  turn 0: "7"   -> observation "1:6="   (question 1 is 6)
  turn 1: "7"   -> observation "2:0="   the pivotal turn: right iff its first character is
                                        (6 + shift) % 10 = "7"
  turn 2: "3"   -> done                 (K = 3 turns)

The answer to question k is the digit (q_k + shift) % 10, one character; the policy's action is
that character and its end-of-sequence token. Reward (`outcome`): 1 iff the first character of
the pivotal turn's action is the right digit. Every other turn is filler: what it says never
changes the reward. Observations never depend on the actions (the questions are fixed by the
example), so the only thing the policy decides is its answers.

Ground truth for `credit.bench.true_turn_advantages`:

  pivot_turns(example) -> (p,)           the turns that decide the reward
  decided_at_turn(example) -> (p, 0)     the last policy token that can change the reward:
                                         character 0 of turn p's action. Contract: the outcome
                                         is known once turn p is played, and equals the outcome
                                         of the episode whose turn-p action is cut after that
                                         character (turns after p never change it).

Demonstrations (the supervised warm-up): the pivotal turn answers right; a filler turn answers
a uniform random digit (`demo_filler="random"`, the default: high-entropy choices that never
matter, the trap of `distractor` carried over to turns; the policy must read the pivotal index
from the prompt and count turns to know where to be right) or its right answer too
(`demo_filler="right"`). Without an rng the filler answers are the fixed digits str(k % 10).

Per turn (`StepResult`, see `credit.envs.base`), by `process_reward`:
  "every" (default): reward 1 when the turn's answer is right, whatever turn it is; progress =
          right answers so far / K — a quiz that grades every question but counts one: a
          process signal of which only the pivotal turn's entry bears on the outcome (a trap
          for methods that trust per-turn rewards);
  "pivot": reward 1 only for a right answer at the pivotal turn; progress = the outcome so far
          (an oracle process reward: what turn-level methods can do at best);
  "none":  reward 0 and progress 0 on every turn (the outcome alone).
  info: `turn`, `correct` (the turn's answer is right), `pivotal` (it is the pivotal turn).

Examples are (prompt, answer, questions) records: `answer` is the pivotal turn's right action
(the gold answer, e.g. "7"), `questions` the K question digits (an integer field, so tfds and
JSON lines carry it). All texts use the character tokenizer's vocabulary. The task is ours (the
survey specifies the idea, not these rules).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

import numpy as np

from credit.envs.base import EpisodeDoneError, Limits, StepResult, task_limits
from credit.tasks.base import register_task, text_field

PROCESS_REWARDS = ("every", "pivot", "none")
DEMO_FILLERS = ("random", "right")
# A small setting the tests and the quick benchmark use: two turns, either may be pivotal.
TINY = {"num_turns": 2}


def _questions(example: Mapping[str, Any]) -> tuple[int, ...]:
  q = example["questions"]
  q = np.asarray(q).reshape(-1).tolist()
  return tuple(int(x) for x in q)


def _parse_prompt(prompt: str) -> tuple[int, int]:
  """(pivotal turn p, question 0) of "p;0:q=" ."""
  head, _, rest = prompt.partition(";")
  if not (head.isdigit() and rest.startswith("0:") and rest.endswith("=") and len(rest) == 4
          and rest[2].isdigit()):
    raise ValueError(f"not a pivot_turn prompt: {prompt!r} (want 'p;0:q=')")
  return int(head), int(rest[2])


@register_task("pivot_turn")
@dataclasses.dataclass(frozen=True)
class PivotTurn:
  """K questions over K turns; one turn, named in the prompt, decides the reward.

  Attributes:
    num_turns: K, questions (and policy turns) per episode, in [2, 10].
    shift: the answer to question q is (q + shift) % 10.
    process_reward: what the environment reports per turn: "every" | "pivot" | "none"
      (module docstring).
    demo_filler: the demonstrator's answers at filler turns: "random" | "right".
  """
  num_turns: int = 3
  shift: int = 1
  process_reward: str = "every"
  demo_filler: str = "random"
  name = "pivot_turn"
  multi_turn = True
  tool_actions = False  # a turn is a bare answer digit, no tool call
  # The gold answer is the whole action (a digit): the runner's gold pass (igpo, a2tgpo, trace,
  # siop) teacher-forces it bare, not in lookup's "answer({answer})".
  gold_template = "{answer}"

  def __post_init__(self):
    if not 2 <= self.num_turns <= 10:
      raise ValueError(f"num_turns must be in [2, 10] (one digit per turn index), got "
                       f"{self.num_turns}")
    if self.process_reward not in PROCESS_REWARDS:
      raise ValueError(f"process_reward={self.process_reward!r}; valid: {PROCESS_REWARDS}")
    if self.demo_filler not in DEMO_FILLERS:
      raise ValueError(f"demo_filler={self.demo_filler!r}; valid: {DEMO_FILLERS}")

  # --- sizes --------------------------------------------------------------------------
  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"questions": (self.num_turns,)}

  @property
  def max_turns(self) -> int:
    return self.num_turns

  @property
  def max_prompt_chars(self) -> int:
    return 6  # "p;0:q="

  @property
  def max_action_chars(self) -> int:
    return 1

  @property
  def max_response_chars(self) -> int:
    return self.max_action_chars

  @property
  def max_observation_chars(self) -> int:
    return 4  # "k:q="

  # --- examples -----------------------------------------------------------------------
  def right_answer(self, q: int) -> str:
    return str((int(q) + self.shift) % 10)

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      p = int(rng.integers(self.num_turns))
      qs = [int(x) for x in rng.integers(10, size=self.num_turns)]
      out.append({"prompt": f"{p};0:{qs[0]}=", "answer": self.right_answer(qs[p]),
                  "questions": qs})
    return out

  def _parse(self, example: Mapping[str, Any]) -> tuple[int, tuple[int, ...]]:
    p, q0 = _parse_prompt(text_field(example, "prompt"))
    qs = _questions(example)
    if len(qs) != self.num_turns or not 0 <= p < self.num_turns or qs[0] != q0:
      raise ValueError(f"example {dict(example)!r} was not generated by {self} (pivotal turn "
                       f"{p}, {len(qs)} questions, question 0 {qs[0] if qs else None} vs the "
                       f"prompt's {q0})")
    return p, qs

  def pivot_turns(self, example: Mapping[str, Any]) -> tuple[int, ...]:
    """The turns whose actions decide the reward: (p,)."""
    return (self._parse(example)[0],)

  def decided_at_turn(self, example: Mapping[str, Any]) -> tuple[int, int]:
    """(turn, action index) of the last policy token that can change the reward: (p, 0)."""
    return (self._parse(example)[0], 0)

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    """1.0 when `response`, the pivotal turn's action, starts with the right digit."""
    return float(response[:1] == text_field(example, "answer"))

  def demonstration_turns(self, example: Mapping[str, Any],
                          rng: np.random.Generator | None = None) -> list[str]:
    p, qs = self._parse(example)
    out = []
    for k, q in enumerate(qs):
      if k == p or self.demo_filler == "right":
        out.append(self.right_answer(q))
      elif rng is not None:
        out.append(str(int(rng.integers(10))))
      else:
        out.append(str(k % 10))
    return out

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    del rng
    return text_field(example, "answer")

  def make_env(self, example: Mapping[str, Any], limits: Limits | None = None
               ) -> "PivotTurnEnv":
    p, qs = self._parse(example)
    return PivotTurnEnv(p, qs, self.shift, self.process_reward, task_limits(self, limits))


class _State(NamedTuple):
  started: bool
  turns: int
  done: bool
  outcome: float
  num_right: int


class PivotTurnEnv:
  """One `pivot_turn` episode (the `credit.envs.Environment` interface); its state is an
  immutable `_State`, so `snapshot` is a reference and `restore` re-rolls from it."""

  def __init__(self, pivot: int, questions: tuple[int, ...], shift: int, process_reward: str,
               limits: Limits):
    self.pivot, self.questions, self.shift = pivot, tuple(questions), shift
    self.process_reward, self.limits = process_reward, limits
    self.prompt = f"{pivot};0:{self.questions[0]}="
    self.gold_answer = str((self.questions[pivot] + shift) % 10)
    self._s = _State(False, 0, False, 0.0, 0)

  def reset(self) -> str:
    self._s = _State(True, 0, False, 0.0, 0)
    return self.prompt

  def step(self, action: str) -> StepResult:
    s = self._s
    if not s.started:
      raise RuntimeError("PivotTurnEnv.step before reset()")
    if s.done:
      raise EpisodeDoneError(f"PivotTurnEnv: the episode is over after {s.turns} turn(s); "
                             "reset() or restore() first")
    k = s.turns
    K = min(len(self.questions), self.limits.max_turns)
    right = action[:1] == str((self.questions[k] + self.shift) % 10)
    pivotal = k == self.pivot
    outcome = float(right) if pivotal else s.outcome
    num_right = s.num_right + int(right)
    done = k + 1 >= K
    if self.process_reward == "every":
      reward, progress = float(right), num_right / len(self.questions)
    elif self.process_reward == "pivot":
      reward, progress = float(right and pivotal), outcome
    else:
      reward, progress = 0.0, 0.0
    obs = "" if done else self.limits.truncate(f"{k + 1}:{self.questions[k + 1]}=")
    self._s = _State(True, k + 1, done, outcome, num_right)
    return StepResult(obs, done, reward, progress, 0,
                      {"turn": k, "correct": right, "pivotal": pivotal, "valid": True})

  def outcome(self) -> float:
    return self._s.outcome

  def snapshot(self) -> _State:
    return self._s

  def restore(self, snap: _State) -> None:
    if not isinstance(snap, _State):
      raise TypeError(f"not a PivotTurnEnv snapshot: {type(snap).__name__}")
    self._s = snap

  @property
  def num_turns(self) -> int:
    return self._s.turns

  @property
  def done(self) -> bool:
    return self._s.done
