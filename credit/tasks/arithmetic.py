"""Multi-digit integer arithmetic: prompt "12+345=", answer "357".

A verifiable task that needs no download, the "hello world" of RL on LLMs
(used e.g. in TinyZero-style recipes). The reward is exact match:

  r(x, y) = 1[strip(y) == str(a ∘ b)]   with ∘ ∈ ops,

where `y` is the response decoded up to eos. Leading zeros, "+357" or any extra
character score 0 (the canonical decimal form is the only correct answer).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np

from credit.tasks.base import register_task, text_field

_PROBLEM = re.compile(r"(\d+)([-+*])(\d+)=")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _sample_number(rng: np.random.Generator, digits: int) -> int:
  lo = 0 if digits == 1 else 10 ** (digits - 1)
  return int(rng.integers(lo, 10 ** digits))


@register_task("arithmetic")
@dataclasses.dataclass(frozen=True)
class Arithmetic:
  """`a op b =` with operands of `min_digits..max_digits` digits.

  Attributes:
    min_digits, max_digits: digit count of each operand, drawn uniformly in this
      range per operand, then the value uniformly among numbers of that length
      (so short numbers are not swamped by long ones).
    ops: operators drawn uniformly, any of "+-*".
    allow_negative: if False, `a - b` has `a >= b` (operands swapped).
    demo_carry_error: an imperfect demonstrator for the supervised warm-up: on problems whose
      units digits need a carry (+) or a borrow (-), its demonstration forgets it with this
      probability (47+38 -> "75", 52-38 -> "24", 38-52 -> "-24": the answer off by 10 in
      magnitude), the typical slip of a weaker model. Imitating it reaches at best the accuracy
      of the problems without a carry; the verifier stays exact, so RL can go beyond it.
      0 = always correct. Applies only when the warm-up passes an rng.
  """
  min_digits: int = 2
  max_digits: int = 3
  ops: str = "+-"
  allow_negative: bool = True
  demo_carry_error: float = 0.0
  name = "arithmetic"

  def __post_init__(self):
    if not 1 <= self.min_digits <= self.max_digits:
      raise ValueError(f"Need 1 <= min_digits <= max_digits, got {self.min_digits}, "
                       f"{self.max_digits}")
    if not self.ops or set(self.ops) - set(_OPS):
      raise ValueError(f"ops must be a non-empty subset of {''.join(_OPS)!r}, got {self.ops!r}")
    if not 0.0 <= self.demo_carry_error <= 1.0:
      raise ValueError(f"demo_carry_error must be in [0, 1], got {self.demo_carry_error}")

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {}

  @property
  def max_prompt_chars(self) -> int:
    return 2 * self.max_digits + 2

  @property
  def max_response_chars(self) -> int:
    n = self.max_digits + 1  # a carry digit, or a minus sign
    return max(n, 2 * self.max_digits) if "*" in self.ops else n

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      d_a, d_b = rng.integers(self.min_digits, self.max_digits + 1, size=2)
      a, b = _sample_number(rng, int(d_a)), _sample_number(rng, int(d_b))
      op = self.ops[int(rng.integers(len(self.ops)))]
      if op == "-" and not self.allow_negative and a < b:
        a, b = b, a
      out.append({"prompt": f"{a}{op}{b}=", "answer": str(_OPS[op](a, b))})
    return out

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    return float(response.strip() == text_field(example, "answer"))

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    answer = text_field(example, "answer")
    if rng is None or not self.demo_carry_error or rng.random() >= self.demo_carry_error:
      return answer
    slip = forgotten_carry(text_field(example, "prompt"))
    return answer if slip is None else str(slip)


def forgotten_carry(prompt: str) -> int | None:
  """The answer to `prompt` ("a+b=" / "a-b=") with the units carry or borrow forgotten, or None
  when the units digits need none (or the operator is "*").

    a + b with (a mod 10) + (b mod 10) >= 10:  a + b - 10
    a - b, x = max(a, b), y = min(a, b), (x mod 10) < (y mod 10):  sign(a - b) · (x - y + 10)
  """
  m = _PROBLEM.fullmatch(prompt.strip())
  if m is None:
    raise ValueError(f"not an arithmetic prompt: {prompt!r}")
  a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
  if op == "+":
    return a + b - 10 if a % 10 + b % 10 >= 10 else None
  if op == "-":
    x, y = max(a, b), min(a, b)
    if x % 10 >= y % 10:
      return None
    return (x - y + 10) * (1 if a >= b else -1)
  return None
