"""Countdown: combine given numbers with + - * / and parentheses to reach a target.

Countdown as an LLM search/RL task: "Stream of Search (SoS): Learning to Search
in Language", Gandhi et al., arXiv:2404.03683; used for R1-Zero-style RL in
TinyZero (github.com/Jiayi-Pan/TinyZero, `countdown.py` reward). Prompt
"22 13 16 7:12=" (numbers, then the target), a correct response "13+22-7-16";
"13-22+21" uses 21, which is not given, and scores 0. The reward is

  r(x, y) = 1                if y parses, uses each given number at most as often as
                               it is given, and evaluates exactly to the target;
            format_reward    if it parses and uses only given numbers, wrong value;
            0                otherwise (syntax error, unknown/reused number, division by 0).

Compared with TinyZero's `verl/utils/reward_score/countdown.py` (read for the
rules: `validate_equation` demands every number exactly once, `format_score`
0.1, value checked with restricted `eval` and a 1e-5 tolerance), deviations:
exact rational arithmetic with our own parser (never `eval`), `format_reward`
defaults to 0, `require_all=False` accepts a subset ("at most once"; set
`require_all=True` for TinyZero's rule), and no <answer> tag (the whole
response is the expression).

Instances are built solvable: a random expression tree over the numbers is drawn
first (integer, non-negative intermediates, exact division) and its value is the
target; that expression is the example's `answer`.
"""
from __future__ import annotations

import collections
import dataclasses
from fractions import Fraction
from typing import Any, Mapping, Sequence

import numpy as np

from credit.tasks.base import int_field, register_task, text_field

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_LEAF_PREC = 3
MAX_DEPTH = 32  # parenthesis nesting limit of the parser


class ExpressionError(ValueError):
  """The response is not a valid countdown expression."""


def _tokenize(text: str) -> list[str]:
  toks, i = [], 0
  while i < len(text):
    c = text[i]
    if c == " ":
      i += 1
    elif c.isdigit():
      j = i
      while j < len(text) and text[j].isdigit():
        j += 1
      num = text[i:j]
      if len(num) > 1 and num[0] == "0":
        raise ExpressionError(f"number with a leading zero: {num!r}")
      toks.append(num)
      i = j
    elif c in "+-*/()":
      toks.append(c)
      i += 1
    else:
      raise ExpressionError(f"unexpected character {c!r} at {i}")
  return toks


class _Parser:
  """Recursive descent over: expr := term (('+'|'-') term)*;
  term := factor (('*'|'/') factor)*; factor := NUMBER | '(' expr ')'."""

  def __init__(self, toks: list[str]):
    self.toks, self.pos, self.numbers = toks, 0, []

  def peek(self) -> str | None:
    return self.toks[self.pos] if self.pos < len(self.toks) else None

  def take(self) -> str:
    tok = self.peek()
    if tok is None:
      raise ExpressionError("unexpected end of expression")
    self.pos += 1
    return tok

  def expr(self, depth: int) -> Fraction:
    value = self.term(depth)
    while self.peek() in ("+", "-"):
      op = self.take()
      rhs = self.term(depth)
      value = value + rhs if op == "+" else value - rhs
    return value

  def term(self, depth: int) -> Fraction:
    value = self.factor(depth)
    while self.peek() in ("*", "/"):
      op = self.take()
      rhs = self.factor(depth)
      if op == "*":
        value = value * rhs
      else:
        if rhs == 0:
          raise ExpressionError("division by zero")
        value = value / rhs
    return value

  def factor(self, depth: int) -> Fraction:
    tok = self.take()
    if tok == "(":
      if depth >= MAX_DEPTH:
        raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
      value = self.expr(depth + 1)
      if self.take() != ")":
        raise ExpressionError("expected ')'")
      return value
    if tok.isdigit():
      self.numbers.append(int(tok))
      return Fraction(int(tok))
    raise ExpressionError(f"unexpected token {tok!r}")


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
  """Exact value of an arithmetic expression and the number literals it uses.

  Grammar: non-negative integer literals (no leading zeros), binary + - * /,
  parentheses, spaces; usual precedence, left associativity; no unary minus.

  Raises:
    ExpressionError: syntax error, division by zero, nesting deeper than MAX_DEPTH.

  >>> evaluate_expression("2+3*(4-1)/9")
  (Fraction(3, 1), [2, 3, 4, 1, 9])
  """
  parser = _Parser(_tokenize(text))
  if parser.peek() is None:
    raise ExpressionError("empty expression")
  value = parser.expr(0)
  if parser.peek() is not None:
    raise ExpressionError(f"unexpected token {parser.peek()!r} after the expression")
  return value, parser.numbers


@dataclasses.dataclass(frozen=True)
class _Node:
  value: int
  text: str
  prec: int


def _combine(left: _Node, op: str, right: _Node) -> _Node | None:
  """`left op right` with minimal parentheses; None if not an exact non-negative integer."""
  a, b = left.value, right.value
  if op == "+":
    v = a + b
  elif op == "-":
    v = a - b
  elif op == "*":
    v = a * b
  else:
    if b == 0 or a % b:
      return None
    v = a // b
  if v < 0:
    return None
  p = _PREC[op]
  lt = f"({left.text})" if left.prec < p else left.text
  rt = f"({right.text})" if right.prec < p or (right.prec == p and op in "-/") else right.text
  return _Node(v, f"{lt}{op}{rt}", p)


def solve_countdown(numbers: Sequence[int], target: int, ops: str = "+-*/", *,
                    require_all: bool = False) -> str | None:
  """An expression reaching `target` from `numbers` (each at most once), or None.

  Exhaustive search over pairwise combinations with non-negative integer
  intermediates and exact division (the space `Countdown.generate` draws from),
  memoising dead multisets. Fine for up to ~5 numbers.
  """
  dead: set[tuple[int, ...]] = set()

  def search(nodes: list[_Node]) -> _Node | None:
    for node in nodes:
      if node.value == target and (len(nodes) == 1 or not require_all):
        return node
    key = tuple(sorted(n.value for n in nodes))
    if len(nodes) < 2 or key in dead:
      return None
    for i in range(len(nodes)):
      for j in range(len(nodes)):
        if i == j:
          continue
        rest = [n for k, n in enumerate(nodes) if k not in (i, j)]
        for op in ops:
          if op in "+*" and i > j:
            continue  # commutative: one order suffices
          node = _combine(nodes[i], op, nodes[j])
          if node is None:
            continue
          found = search(rest + [node])
          if found is not None:
            return found
    dead.add(key)
    return None

  found = search([_Node(int(x), str(int(x)), _LEAF_PREC) for x in numbers])
  return None if found is None else found.text


@register_task("countdown")
@dataclasses.dataclass(frozen=True)
class Countdown:
  """Reach a target from `num_numbers` numbers in [1, max_number].

  Attributes:
    num_numbers: how many numbers the prompt gives.
    max_number: numbers are drawn uniformly from [1, max_number].
    max_target: targets lie in [1, max_target] (instances are redrawn until so).
    ops: operators the constructed solutions use (the verifier accepts all four).
    require_all: the response must use every number exactly once.
    format_reward: reward for a valid expression over allowed numbers with a wrong value.
  """
  num_numbers: int = 4
  max_number: int = 25
  max_target: int = 100
  ops: str = "+-*/"
  require_all: bool = False
  format_reward: float = 0.0
  name = "countdown"

  def __post_init__(self):
    if self.num_numbers < 2 or self.max_number < 1 or self.max_target < 1:
      raise ValueError("Need num_numbers >= 2, max_number >= 1, max_target >= 1")
    if not self.ops or set(self.ops) - set(_PREC):
      raise ValueError(f"ops must be a non-empty subset of '+-*/', got {self.ops!r}")
    if not 0.0 <= self.format_reward < 1.0:
      raise ValueError(f"format_reward must be in [0, 1), got {self.format_reward}")

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"numbers": (self.num_numbers,), "target": ()}

  @property
  def max_prompt_chars(self) -> int:
    return self.num_numbers * (len(str(self.max_number)) + 1) + len(str(self.max_target)) + 1

  @property
  def max_response_chars(self) -> int:
    # Leaves, n-1 operators, at most one pair of parentheses per non-root inner node.
    n = self.num_numbers
    return n * len(str(self.max_number)) + (n - 1) + 2 * (n - 2)

  def _draw(self, rng: np.random.Generator) -> tuple[list[int], _Node] | None:
    numbers = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
    nodes = [_Node(x, str(x), _LEAF_PREC) for x in numbers]
    while len(nodes) > 1:
      i, j = (int(k) for k in rng.choice(len(nodes), size=2, replace=False))
      a, b = nodes[i], nodes[j]
      rest = [n for k, n in enumerate(nodes) if k not in (i, j)]
      node = None
      for op in rng.permutation(list(self.ops)):
        node = _combine(a, str(op), b) or (_combine(b, str(op), a) if op in "-/" else None)
        if node is not None:
          break
      if node is None:
        return None
      nodes = rest + [node]
    if not 1 <= nodes[0].value <= self.max_target:
      return None
    return numbers, nodes[0]

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    while len(out) < n:
      drawn = self._draw(rng)
      if drawn is None:
        continue
      numbers, root = drawn
      shown = [numbers[k] for k in rng.permutation(len(numbers))]
      target = root.value
      out.append({"prompt": f"{' '.join(map(str, shown))}:{target}=", "answer": root.text,
                  "numbers": shown, "target": target})
    return out

  def _numbers_target(self, example: Mapping[str, Any]) -> tuple[list[int], int]:
    if "numbers" in example and "target" in example:
      return [int(x) for x in np.asarray(example["numbers"]).reshape(-1)], int_field(example,
                                                                                   "target")
    nums, target = text_field(example, "prompt").rstrip("=").split(":")
    return [int(x) for x in nums.split()], int(target)

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    numbers, target = self._numbers_target(example)
    try:
      value, used = evaluate_expression(response.strip())
    except ExpressionError:
      return 0.0
    available = collections.Counter(numbers)
    used_count = collections.Counter(used)
    if any(c > available[x] for x, c in used_count.items()):
      return 0.0
    if self.require_all and used_count != available:
      return 0.0
    return 1.0 if value == target else float(self.format_reward)

  def flag_chars(self, example: Mapping[str, Any], response: str) -> np.ndarray:
    """Per-character flags of a wrong response: from its first wrong step onward.

    A response the verifier accepts (reward 1) gets no flag. Otherwise the characters are
    read left to right and the first step that cannot belong to any solution is flagged
    with everything after it: a character outside the expression alphabet, a number with a
    leading zero, or a number the prompt does not offer (not given, or already used as
    often as given; a hallucinated number, Perceval's case). When every number is
    legitimate but the expression is malformed, incomplete or has the wrong value, the
    error is not in one step that can be located without a search over all solutions: the
    whole response is flagged. The last entry stands for the end of the response (its
    stop token) and is flagged with the characters before it.

      "3 5 7:22=" "3*5+7" -> ......   "3*9+7" -> ..####   "3+5+7" -> ######

    Args:
      example: the example (`numbers`, `target`, or its prompt).
      response: the response text, decoded up to eos.

    Returns:
      [len(response) + 1] bool.
    """
    flags = np.zeros(len(response) + 1, bool)
    if self.verify(example, response) == 1.0:
      return flags
    numbers, _ = self._numbers_target(example)
    left = collections.Counter(numbers)
    i = 0
    while i < len(response):
      c = response[i]
      if c.isdigit():
        j = i
        while j < len(response) and response[j].isdigit():
          j += 1
        num = response[i:j]
        if (len(num) > 1 and num[0] == "0") or left[int(num)] == 0:
          flags[i:] = True
          return flags
        left[int(num)] -= 1
        i = j
      elif c in " +-*/()":
        i += 1
      else:
        flags[i:] = True
        return flags
    flags[:] = True
    return flags

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    """The example's constructed `answer` when it verifies, else a solver's expression."""
    if "answer" in example:
      answer = text_field(example, "answer")
      if self.verify(example, answer) == 1.0:
        return answer
    numbers, target = self._numbers_target(example)
    found = solve_countdown(numbers, target, "+-*/", require_all=self.require_all)
    if found is None:
      raise ValueError(f"Countdown instance {numbers} -> {target} has no solution")
    return found
