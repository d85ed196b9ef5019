"""Bifurcation tasks: response positions that decide the reward are known exactly.

Controlled bifurcation tasks, as a survey of credit assignment asks for ("From
Reasoning to Agentic: Credit Assignment in Reinforcement Learning for Large Language Models":
a benchmark protocol with controlled bifurcation tasks). Each task here, like `pivotal`, gives
its ground truth to `credit.bench`:

  pivot_positions(example) -> tuple[int, ...]  response indices that decide the reward
  decided_at(example) -> int                    the last index that can still change it:
                                                verify(r) == verify(r[:d+1]) if len(r) > d

Responses are character strings under the character tokenizer, so a response index is a
response token index; positions are absolute (no stripping). Prompts have a fixed length for a
given task setting, and demonstrations put filler at free positions, so a small transformer
fits each rule after a short supervised warm-up. Everything is parsed from the prompt (no
integer fields), so examples survive any data path (tfds, JSON lines) unchanged.

- `pivotal_and`: k pivots, each needs its digit; reward 1 only if all are right.
- `pivotal_or`: k pivots; reward 1 if any one is right (once one is right the later ones no
  longer matter under the policy, but all k stay in `pivot_positions`).
- `distractor`: one pivot as in `pivotal`; the demonstrations put a constant filler character
  everywhere except at m distractor positions, where they draw a character uniformly from a
  wide alphabet. A trained policy is uncertain there (high entropy) though the choice never
  matters: the trap for methods that credit by entropy alone.
- `delayed`: the pivot is one of the first positions and the response is long: the decision
  is early and its evidence comes only at the end, as with every outcome reward. The reward is
  decided by the pivot alone (decided_at = the pivot), so the true advantage of the long tail
  is exactly 0, and methods that spread credit over it (or discount it away from the decision)
  show it.
The tasks are ours (the survey specifies the idea, not these rules).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from credit.tasks.base import register_task, text_field


def _fill(filler: str, n: int, rng: np.random.Generator | None, fixed: Mapping[int, str]) -> str:
  """n filler characters (the first of `filler`, or uniform draws when `rng` is given) with
  `fixed` {position: character} written over them."""
  if rng is None:
    chars = [filler[0]] * n
  else:
    chars = [filler[int(k)] for k in rng.integers(len(filler), size=n)]
  for p, c in fixed.items():
    chars[p] = c
  return "".join(chars)


def judge_pivot_step(want: Mapping[int, str], steps_before: list[str], step: str, *,
                     any_suffices: bool = False) -> tuple[float, float, bool]:
  """The exact step judge of a bifurcation task: (r, 0.0, False), r = +1 right, −1 wrong.

  `want` maps each pivot (absolute response index) to its digit. `step` is the response's
  next piece of text after `steps_before` (any length; the steps of `credit`'s step splitter,
  stop tokens left out); "" is the response's end. A step is wrong when it writes a pivot
  with the wrong character, or when the response ends before a pivot is written; filler is
  never wrong. With `any_suffices` (the OR rule) every step after the first right pivot is
  right (the end too). The verdict is local, as a process judge's: under OR a wrong pivot is
  wrong even when a later one still saves the outcome. Ground truth for the step-reward estimators in `credit.bench` (a perfect PRM).
  """
  start = sum(len(s) for s in steps_before)
  done = "".join(steps_before)
  hit = any(q < start and len(done) > q and done[q] == w for q, w in want.items())
  if any_suffices and hit:
    return 1.0, 0.0, False
  if not step:  # the response ends: a pivot never written is an error (OR: unless one hit)
    return (-1.0 if any(q >= start for q in want) else 1.0), 0.0, False
  for i, ch in enumerate(step):
    w = want.get(start + i)
    if w is None:
      continue
    if ch == w and any_suffices:
      return 1.0, 0.0, False
    if ch != w:
      return -1.0, 0.0, False
  return 1.0, 0.0, False


def pivot_flags(want: Mapping[int, str], response: str, success: bool) -> np.ndarray:
  """[len(response) + 1] bool: the characters a process judge would mark in a failed
  response, exactly: each pivot written with the wrong character, and the last entry (the
  response's end) when it stops before a pivot. A successful response gets no flag. Unlike
  arithmetic's first-error spans, filler after a wrong pivot is not flagged: it never
  matters here."""
  flags = np.zeros(len(response) + 1, bool)
  if success:
    return flags
  for q, w in want.items():
    if q < len(response):
      flags[q] = response[q] != w
    else:
      flags[-1] = True
  return flags


def single_pivot_interventions(prompt: str) -> list[str]:
  """M = 2 answer-preserving rewrites of a "p:d=" prompt (SCAPO's semifactual
  interventions): a leading zero on the position, then on the digit ("6:3=" ->
  ["06:3=", "6:03="]). Both parse to the same rule, so the answer is unchanged; they are
  surface forms the demonstrations never show."""
  p, d = prompt.rstrip("=").split(":")
  return [f"0{p}:{d}=", f"{p}:0{d}="]


def _check_digits_free(alphabet: str, what: str) -> None:
  if not alphabet or any(c.isdigit() for c in alphabet):
    raise ValueError(f"{what} must be non-empty and digit-free, got {alphabet!r}")


@dataclasses.dataclass(frozen=True)
class _MultiPivot:
  """k distinct pivots p_1 < ... < p_k, each asking for digit (d_i + shift) % 10.

  Prompt: the k positions, ":", the k digits, "=", e.g. "14:37=" (response_len <= 10).
  """
  response_len: int = 6
  num_pivots: int = 2
  shift: int = 1
  filler: str = "abcdefghij"
  name = "_multi_pivot"

  def __post_init__(self):
    if not 1 <= self.response_len <= 10:
      raise ValueError(f"response_len must be in [1, 10] (one digit per position), got "
                       f"{self.response_len}")
    if not 1 <= self.num_pivots <= self.response_len:
      raise ValueError(f"num_pivots must be in [1, response_len={self.response_len}], got "
                       f"{self.num_pivots}")
    _check_digits_free(self.filler, "filler")

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {}

  @property
  def max_prompt_chars(self) -> int:
    return 2 * self.num_pivots + 2

  @property
  def max_response_chars(self) -> int:
    return self.response_len

  def _parse(self, example: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(positions in ascending order, the digit each asks for): the pairs in any order."""
    pos, digits = text_field(example, "prompt").rstrip("=").split(":")
    pairs = sorted(zip((int(c) for c in pos),
                       (str((int(c) + self.shift) % 10) for c in digits)))
    return tuple(p for p, _ in pairs), tuple(w for _, w in pairs)

  def interventions(self, example: Mapping[str, Any]) -> list[str]:
    """SCAPO's answer-preserving prompt rewrites: the k (position, digit) pairs rotated by
    1, ..., k − 1 ("14:37=" -> ["41:73="]; M = k − 1). The rule is unchanged, in an order
    the demonstrations never show (they list the positions ascending)."""
    pos, digits = text_field(example, "prompt").rstrip("=").split(":")
    if len(pos) < 2:
      raise ValueError(f"{self.name}: one pivot has no reordering to rewrite its prompt "
                       "with (SCAPO's interventions); use num_pivots >= 2, or `pivotal`")
    return [f"{pos[r:]}{pos[:r]}:{digits[r:]}{digits[:r]}=" for r in range(1, len(pos))]

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      pos = sorted(int(p) for p in rng.choice(self.response_len, self.num_pivots,
                                              replace=False))
      digits = [int(d) for d in rng.integers(10, size=self.num_pivots)]
      prompt = "".join(map(str, pos)) + ":" + "".join(map(str, digits)) + "="
      ex = {"prompt": prompt}
      ex["answer"] = self.demonstration(ex, rng)
      out.append(ex)
    return out

  def pivot_positions(self, example: Mapping[str, Any]) -> tuple[int, ...]:
    return self._parse(example)[0]

  def decided_at(self, example: Mapping[str, Any]) -> int:
    return self._parse(example)[0][-1]

  def _hits(self, example: Mapping[str, Any], response: str) -> list[bool]:
    pos, want = self._parse(example)
    return [len(response) > p and response[p] == w for p, w in zip(pos, want)]

  def judge_step(self, example: Mapping[str, Any], steps_before: list[str], step: str
                 ) -> tuple[float, float, bool]:
    """Exact step verdict (`judge_pivot_step`; OR: `any_suffices`)."""
    pos, want = self._parse(example)
    return judge_pivot_step(dict(zip(pos, want)), steps_before, step,
                            any_suffices=self.name == "pivotal_or")

  def flag_chars(self, example: Mapping[str, Any], response: str) -> np.ndarray:
    """The wrong pivots of a failed response (`pivot_flags`)."""
    pos, want = self._parse(example)
    return pivot_flags(dict(zip(pos, want)), response, self.verify(example, response) == 1.0)

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    pos, want = self._parse(example)
    return _fill(self.filler, self.response_len, rng, dict(zip(pos, want)))


@register_task("pivotal_and")
@dataclasses.dataclass(frozen=True)
class PivotalAnd(_MultiPivot):
  """Every pivot must carry its digit (AND)."""
  name = "pivotal_and"

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    return float(all(self._hits(example, response)))


@register_task("pivotal_or")
@dataclasses.dataclass(frozen=True)
class PivotalOr(_MultiPivot):
  """Any one pivot with its digit suffices (OR)."""
  name = "pivotal_or"

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    return float(any(self._hits(example, response)))


class _SinglePivot:
  """One pivot: prompt "p:d=" asks for digit (d + shift) % 10 at response index p, with p
  drawn from `_pivot_range()`. Subclasses give the demonstrations' filler."""
  response_len: int
  shift: int

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {}

  @property
  def max_prompt_chars(self) -> int:
    return 4

  @property
  def max_response_chars(self) -> int:
    return self.response_len

  def _pivot_range(self) -> int:
    return self.response_len

  def _parse(self, example: Mapping[str, Any]) -> tuple[int, str]:
    p, d = text_field(example, "prompt").rstrip("=").split(":")
    return int(p), str((int(d) + self.shift) % 10)

  def pivot_positions(self, example: Mapping[str, Any]) -> tuple[int, ...]:
    return (self._parse(example)[0],)

  def decided_at(self, example: Mapping[str, Any]) -> int:
    return self._parse(example)[0]

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      ex = {"prompt": f"{int(rng.integers(self._pivot_range()))}:{int(rng.integers(10))}="}
      ex["answer"] = self.demonstration(ex, rng)
      out.append(ex)
    return out

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    p, want = self._parse(example)
    return float(len(response) > p and response[p] == want)

  def interventions(self, example: Mapping[str, Any]) -> list[str]:
    """SCAPO's answer-preserving prompt rewrites (`single_pivot_interventions`)."""
    return single_pivot_interventions(text_field(example, "prompt"))

  def judge_step(self, example: Mapping[str, Any], steps_before: list[str], step: str
                 ) -> tuple[float, float, bool]:
    """Exact step verdict (`judge_pivot_step`): wrong only at the pivot, or ending before it."""
    p, want = self._parse(example)
    return judge_pivot_step({p: want}, steps_before, step)

  def flag_chars(self, example: Mapping[str, Any], response: str) -> np.ndarray:
    """The wrong pivot of a failed response, or its end when it stops before the pivot."""
    p, want = self._parse(example)
    return pivot_flags({p: want}, response, self.verify(example, response) == 1.0)


@register_task("distractor")
@dataclasses.dataclass(frozen=True)
class Distractor(_SinglePivot):
  """One pivot ("p:d=" -> digit (d + shift) % 10 at p) and m high-entropy distractors.

  Demonstrations: `constant` at every free position, except the distractor positions — the
  first `num_distractors` indices other than p — which get a uniform draw from `wide`.
  """
  response_len: int = 6
  num_distractors: int = 2
  shift: int = 1
  constant: str = "a"
  wide: str = "bcdefghijklmnopqrstuvwxyz"
  name = "distractor"

  def __post_init__(self):
    if not 2 <= self.response_len <= 10:
      raise ValueError(f"response_len must be in [2, 10], got {self.response_len}")
    if not 1 <= self.num_distractors < self.response_len:
      raise ValueError(f"num_distractors must be in [1, response_len), got "
                       f"{self.num_distractors}")
    _check_digits_free(self.constant, "constant")
    _check_digits_free(self.wide, "wide")
    if len(self.constant) != 1 or self.constant in self.wide or len(self.wide) < 2:
      raise ValueError("constant must be one character outside `wide` (>= 2 characters)")

  def distractor_positions(self, example: Mapping[str, Any]) -> tuple[int, ...]:
    p, _ = self._parse(example)
    return tuple([i for i in range(self.response_len) if i != p][:self.num_distractors])

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    p, want = self._parse(example)
    chars = [self.constant] * self.response_len
    for i, q in enumerate(self.distractor_positions(example)):
      chars[q] = self.wide[int(rng.integers(len(self.wide))) if rng is not None
                           else i % len(self.wide)]
    chars[p] = want
    return "".join(chars)


@register_task("delayed")
@dataclasses.dataclass(frozen=True)
class Delayed(_SinglePivot):
  """An early decision, a long tail: "p:d=" with p < `early`, response_len filler after."""
  response_len: int = 16
  early: int = 2
  shift: int = 1
  filler: str = "abcdefghij"
  name = "delayed"

  def __post_init__(self):
    if not 1 <= self.early <= min(10, self.response_len):
      raise ValueError(f"early must be in [1, min(10, response_len)], got {self.early}")
    _check_digits_free(self.filler, "filler")

  def _pivot_range(self) -> int:
    return self.early

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    p, want = self._parse(example)
    return _fill(self.filler, self.response_len, rng, {p: want})
