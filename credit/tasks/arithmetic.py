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
    demo_carry_error: an imperfect demonstrator for the supervised warm-up: on problems that
      need a carry (+) or a borrow (-), its demonstration forgets them with this probability,
      working each column on its own (67+58 -> "15", 52-38 -> "26"; `forgotten_carry`), the
      classic slip of column arithmetic. Above 0.5, imitating it gets at best the problems
      without a carry right (about 40% of 2-digit +/-); the verifier stays exact, so RL can
      go beyond it. 0 = always correct. Applies only when the warm-up passes an rng.
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

  def flag_chars(self, example: Mapping[str, Any], response: str) -> np.ndarray:
    """Per-character flags of a wrong response: from its first wrong character onward.

    The span a process judge would mark, in the convention of first-error step labels
    (PRM800K, ProcessBench): the response is compared with the gold answer character by
    character after any leading whitespace; the first character that differs, and
    everything after it, is flagged. A response the verifier accepts gets no flag. The
    last entry stands for the end of the response (its stop token): flagged when the
    response stops too early (a strict prefix of the answer, e.g. "35" for "357") or ends
    after a flagged character.

      57+68= "125" -> ....   "115" -> .###   "12" -> ..#   "1256" -> ...##

    Args:
      example: the example (its `answer`).
      response: the response text, decoded up to eos.

    Returns:
      [len(response) + 1] bool.
    """
    flags = np.zeros(len(response) + 1, bool)
    if self.verify(example, response) == 1.0:
      return flags
    answer = text_field(example, "answer")
    start = len(response) - len(response.lstrip())
    body = response[start:]
    k = 0
    while k < min(len(body), len(answer)) and body[k] == answer[k]:
      k += 1
    flags[start + k:] = True
    return flags

  def interventions(self, example: Mapping[str, Any]) -> list[str]:
    """M = 2 answer-preserving rewrites of the prompt (SCAPO's semifactual interventions).

    The problem is restated with the same value, so the gold answer and the verifier are
    unchanged; every rewrite uses only the prompt's own characters and "0":

      "a+b=" -> ["b+a=", "a+b+0="]     "a-b=" -> ["0+a-b=", "a-b+0="]
      "a*b=" -> ["b*a=", "a*b+0="]

    (evaluated left to right, as written); with a == b the swap would be the prompt itself,
    so "0+a op b=" stands in for it. Raises ValueError on a prompt that is not "a op b=".
    """
    prompt = text_field(example, "prompt")
    m = _PROBLEM.fullmatch(prompt.strip())
    if m is None:
      raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    a, op, b = m.groups()
    first = f"0+{a}{op}{b}=" if op == "-" or a == b else f"{b}{op}{a}="
    return [first, f"{a}{op}{b}+0="]

  def privileged_context(self, example: Mapping[str, Any], kind: str) -> str:
    """Text a self-teacher sees before the prompt (`--config.teacher.context=<kind>`).

    "hint": a partial answer — its length and last digit ("3 digits, ends in 7" for 357;
    a sign counts as a digit), which tells a teacher where the carry went without giving
    the middle digits. Raises ValueError for another kind ("answer" is handled by the
    runner for every task).
    """
    if kind != "hint":
      raise ValueError(f"arithmetic has privileged contexts ['hint'], not {kind!r}")
    answer = text_field(example, "answer")
    return f"{len(answer)} digits, ends in {answer[-1]}"

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    answer = text_field(example, "answer")
    if rng is None or not self.demo_carry_error or rng.random() >= self.demo_carry_error:
      return answer
    slip = forgotten_carry(text_field(example, "prompt"))
    return answer if slip is None else str(slip)


def forgotten_carry(prompt: str) -> int | None:
  """The answer to `prompt` ("a+b=" / "a-b=") worked column by column with every carry and
  borrow forgotten, or None when that is the true answer (no column needs one) or the
  operator is "*". The two classic column-arithmetic slips:

    a + b: each column (a_i + b_i) mod 10            (67+58 -> 15, 47+38 -> 75)
    a - b: x = max(a, b), y = min(a, b); each column |x_i − y_i| ("smaller from larger"),
           with the sign of a − b                     (52-38 -> 26, 38-52 -> -26)
  """
  m = _PROBLEM.fullmatch(prompt.strip())
  if m is None:
    raise ValueError(f"not an arithmetic prompt: {prompt!r}")
  a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
  if op not in "+-":
    return None
  x, y = (a, b) if op == "+" else (max(a, b), min(a, b))
  slip, place = 0, 1
  while x or y:
    col = (x % 10 + y % 10) % 10 if op == "+" else abs(x % 10 - y % 10)
    slip, place, x, y = slip + col * place, place * 10, x // 10, y // 10
  slip = -slip if op == "-" and a < b else slip
  return None if slip == _OPS[op](a, b) else slip
