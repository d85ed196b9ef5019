"""Pivotal decision: exactly one known response position decides the reward.

A probe for credit assignment. The prompt "p:d=" asks for a response whose
character at index p is the digit (d + shift) mod 10; every other response
position is free filler that never changes the reward:

  r(x, y) = 1[len(y) > p  and  y[p] == str((d + shift) mod 10)].

So the pivotal token of every sample is known exactly (`pivot_position`, an index
into the response tokens under the character tokenizer), and an estimator's
advantage mass on it can be scored. Motivated by "pivotal tokens" (Phi-4
Technical Report, arXiv:2412.08905, pivotal token search) and "critical tokens"
("Critical Tokens Matter", arXiv:2411.19943); the task itself is ours, not
taken from either paper.

Learnability: prompts have a fixed length when `response_len <= 10`, the rule is
a 10-entry lookup at one position, and demonstrations put a filler letter at
every other position, so a small transformer fits it after a short supervised
warm-up. From scratch, a uniform policy over the 54 character ids hits the pivot
digit with probability ≈ 1/54 per sample, so about a quarter of groups of 16
samples contain a success.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from credit.tasks.base import int_field, register_task, text_field
from credit.tasks.bifurcation import (judge_pivot_step, pivot_flags,
                                       single_pivot_interventions)


@register_task("pivotal")
@dataclasses.dataclass(frozen=True)
class Pivotal:
  """Write digit (d + shift) % 10 at response index p; the rest is filler.

  Attributes:
    response_len: length of demonstrations; pivots lie in [0, response_len).
    shift: the rule's offset (0: copy the digit).
    filler: alphabet of the demonstrations' filler characters (drawn uniformly
      per position, so demonstrations carry entropy off the pivot).
  """
  response_len: int = 8
  shift: int = 1
  filler: str = "abcdefghij"
  name = "pivotal"

  def __post_init__(self):
    if self.response_len < 1:
      raise ValueError(f"response_len must be >= 1, got {self.response_len}")
    if not self.filler or any(c.isdigit() for c in self.filler):
      raise ValueError(f"filler must be non-empty and digit-free, got {self.filler!r}")

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"pivot_position": (), "pivot_value": ()}

  @property
  def max_prompt_chars(self) -> int:
    return len(str(self.response_len - 1)) + 3

  @property
  def max_response_chars(self) -> int:
    return self.response_len

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      p = int(rng.integers(self.response_len))
      d = int(rng.integers(10))
      value = (d + self.shift) % 10
      fill = rng.integers(len(self.filler), size=self.response_len)
      chars = [self.filler[int(k)] for k in fill]
      chars[p] = str(value)
      out.append({"prompt": f"{p}:{d}=", "answer": "".join(chars), "pivot_position": p,
                  "pivot_value": value})
    return out

  def _pivot(self, example: Mapping[str, Any]) -> tuple[int, int]:
    if "pivot_position" in example and "pivot_value" in example:
      return int_field(example, "pivot_position"), int_field(example, "pivot_value")
    p, d = text_field(example, "prompt").rstrip("=").split(":")
    return int(p), (int(d) + self.shift) % 10

  def pivot_positions(self, example: Mapping[str, Any]) -> tuple[int, ...]:
    """The response index that decides the reward (ground truth for `credit.bench`)."""
    return (self._pivot(example)[0],)

  def decided_at(self, example: Mapping[str, Any]) -> int:
    """The last response index that can change the reward: the pivot."""
    return self._pivot(example)[0]

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    """1.0 iff response[p] is the required digit; no stripping (positions are absolute)."""
    p, value = self._pivot(example)
    return float(len(response) > p and response[p] == str(value))

  def judge_step(self, example: Mapping[str, Any], steps_before: list[str], step: str
                 ) -> tuple[float, float, bool]:
    """Exact step verdict (`bifurcation.judge_pivot_step`): (−1, 0, False) for a step that
    writes the pivot wrong or ends the response before it, else (1, 0, False)."""
    p, value = self._pivot(example)
    return judge_pivot_step({p: str(value)}, steps_before, step)

  def interventions(self, example: Mapping[str, Any]) -> list[str]:
    """SCAPO's answer-preserving prompt rewrites (`bifurcation.single_pivot_interventions`)."""
    return single_pivot_interventions(text_field(example, "prompt"))

  def flag_chars(self, example: Mapping[str, Any], response: str) -> np.ndarray:
    """The wrong pivot of a failed response, or its end when it stops before the pivot
    (`bifurcation.pivot_flags`)."""
    p, value = self._pivot(example)
    return pivot_flags({p: str(value)}, response, self.verify(example, response) == 1.0)

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    if "answer" in example:
      return text_field(example, "answer")
    p, value = self._pivot(example)
    chars = [self.filler[0]] * self.response_len
    chars[p] = str(value)
    return "".join(chars)
