"""`calculator`: multi-step arithmetic, one operation per turn with a calculator tool.

The prompt is an expression of n operations on small integers, "(3+4)*2-5=?". Each turn
the policy calls the calculator on one operation, `calc(3+4)`, and the environment answers
its value and the expression as it now stands, "7; now 7*2-5"; the last turn is
`answer(9)`. The demonstration reduces the leftmost reducible operation each turn
(n + 1 turns):

  calc(3+4) -> "7; now 7*2-5"   calc(7*2) -> "14; now 14-5"   calc(14-5) -> "9; now 9"
  answer(9)

The expression is a binary tree written with the usual precedence (`*` over `+ -`, left
to right) and the fewest parentheses that keep the tree (a right operand of the same
precedence is parenthesised: "2-(3+1)"). An operation is *reducible* when both its operands
are numbers; a call `calc(a op b)` is a *correct step* iff `a op b` is a reducible
operation of the current expression with the same operator and operands, in the written
order (or swapped, for `+` and `*`). A correct step replaces that operation (the leftmost
such one) by its value. Any other well-formed call `calc(a op b)` is still computed (it
is a calculator) but is an incorrect step and leaves the expression unchanged; text that is
not one operation on two non-negative integers, or an unknown tool, is an error
observation. Every intermediate value of a generated expression is >= 0.

Per turn (`StepResult`, see `credit.envs.base`):
  reward    1 for a correct step, else 0 (the answer turn gets 0: the outcome rewards it);
  progress  (operations correctly reduced so far) / n;
  info      `gold_calls`: every correct call of the state the turn was played in (the
            reducible operations, left to right; `answer(v)` once fully reduced),
            `correct`: a correct step (answer turn: the answer is right),
            `value`: the calculator's result (None for an error).
`first_error_turn()` gives the first turn that was not correct (-1: none).
Outcome: 1 if the answer turn's value equals the expression's value exactly (canonical
integer, "9", not "09"), else 0. `gold_answer` is the correct answer turn, "answer(9)".
All texts use only the character tokenizer's vocabulary.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Union

import numpy as np

from credit.envs.base import Limits, TextEnv, Turn, task_limits
from credit.envs.tools import ANSWER, Action, ToolFormat, parse_action
from credit.tasks.base import register_task, text_field

Tree = Union[int, tuple]  # a leaf value, or (op, left, right)
_PREC = {"+": 1, "-": 1, "*": 2}
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_CALL = re.compile(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*")
_TOKEN = re.compile(r"\d+|[-+*()]")


def evaluate(tree: Tree) -> int:
  if isinstance(tree, int):
    return tree
  op, left, right = tree
  return _APPLY[op](evaluate(left), evaluate(right))


def render(tree: Tree) -> str:
  """The expression text with the fewest parentheses that keep `tree` (module docstring)."""
  if isinstance(tree, int):
    return str(tree)
  op, left, right = tree
  ls, rs = render(left), render(right)
  if not isinstance(left, int) and _PREC[left[0]] < _PREC[op]:
    ls = f"({ls})"
  if not isinstance(right, int) and _PREC[right[0]] <= _PREC[op]:
    rs = f"({rs})"
  return f"{ls}{op}{rs}"


def parse(text: str) -> Tree:
  """The tree of an expression written by `render` (left-associative, `*` binds tighter)."""
  toks = _TOKEN.findall(text)
  if "".join(toks) != text.replace(" ", ""):
    raise ValueError(f"not an expression: {text!r}")
  pos = 0

  def atom() -> Tree:
    nonlocal pos
    if pos >= len(toks):
      raise ValueError(f"truncated expression: {text!r}")
    tok = toks[pos]
    pos += 1
    if tok == "(":
      t = expr(1)
      if pos >= len(toks) or toks[pos] != ")":
        raise ValueError(f"unbalanced parentheses: {text!r}")
      pos += 1
      return t
    if not tok.isdigit():
      raise ValueError(f"unexpected {tok!r} in {text!r}")
    return int(tok)

  def expr(min_prec: int) -> Tree:
    nonlocal pos
    left = atom()
    while pos < len(toks) and toks[pos] in _PREC and _PREC[toks[pos]] >= min_prec:
      op = toks[pos]
      pos += 1
      left = (op, left, expr(_PREC[op] + 1))
    return left

  tree = expr(1)
  if pos != len(toks):
    raise ValueError(f"trailing text in {text!r}")
  return tree


def reducible(tree: Tree) -> list[tuple[str, int, int]]:
  """The operations with two number operands, left to right."""
  if isinstance(tree, int):
    return []
  op, left, right = tree
  if isinstance(left, int) and isinstance(right, int):
    return [(op, left, right)]
  return reducible(left) + reducible(right)


def reduce_once(tree: Tree, target: tuple[str, int, int]) -> tuple[Tree, bool]:
  """`tree` with the leftmost reducible operation equal to `target` replaced by its value."""
  if isinstance(tree, int):
    return tree, False
  op, left, right = tree
  if isinstance(left, int) and isinstance(right, int):
    if (op, left, right) == target:
      return _APPLY[op](left, right), True
    return tree, False
  new_left, done = reduce_once(left, target)
  if done:
    return (op, new_left, right), True
  new_right, done = reduce_once(right, target)
  return (op, left, new_right), done


def _replace_leftmost(tree: Tree, target: tuple[str, int, int], value: int) -> Tree:
  """`tree` with the leftmost reducible operation equal to `target` replaced by `value`."""
  if isinstance(tree, int):
    return tree
  op, left, right = tree
  if isinstance(left, int) and isinstance(right, int):
    return value if (op, left, right) == target else tree
  new_left = _replace_leftmost(left, target, value)
  if new_left != left:
    return (op, new_left, right)
  return (op, left, _replace_leftmost(right, target, value))


def _first_digit(v: int) -> int:
  """A multi-digit value copied with its first digit only (the truncating demonstrator)."""
  return int(str(v)[0]) if v >= 10 else v


def count_ops(tree: Tree) -> int:
  return 0 if isinstance(tree, int) else 1 + count_ops(tree[1]) + count_ops(tree[2])


@register_task("calculator")
@dataclasses.dataclass(frozen=True)
class Calculator:
  """Multi-step arithmetic with a `calc(a op b)` tool (module docstring).

  Attributes:
    min_ops, max_ops: n, the number of operations, uniform in this range per example.
    max_operand: leaves are uniform in [1, max_operand].
    ops: operators drawn uniformly, a subset of "+-*". A "-" whose left value is smaller
      than its right one has its operands swapped, so every value is >= 0.
    show_state: observations end with "; now <expression>" (else the value alone).
    extra_turns: turns allowed beyond a demonstration's n + 1 (max_turns = max_ops + 1 +
      extra_turns).
    max_observation_chars: observations are cut to this many characters.
    call_open, call_close: tool-call markers (`ToolFormat`); "" for the character model.
    demo_truncate: an imperfect demonstrator for the supervised warm-up: with this
      probability (per episode) it copies every multi-digit operand with its first digit
      only ("now 48+5" -> `calc(4+5)`), a copying slip of small models, and carries the
      wrong value on: that step and every later one are incorrect steps (reward 0; the
      calculator computes them, the expression stays), and the answer is wrong. The slip
      is tied to the context (a multi-digit operand), so a policy that imitates it
      truncates there under greedy decoding too; only the reward can teach it to copy.
  """
  min_ops: int = 2
  max_ops: int = 3
  max_operand: int = 9
  ops: str = "+-*"
  show_state: bool = True
  extra_turns: int = 1
  max_observation_chars: int = 52
  call_open: str = ""
  call_close: str = ""
  demo_truncate: float = 0.0
  name = "calculator"
  multi_turn = True
  tool_actions = True  # turns are tool calls (each step's info holds the parsed `action`)

  def __post_init__(self):
    if not 1 <= self.min_ops <= self.max_ops:
      raise ValueError(f"Need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
    if self.max_operand < 1:
      raise ValueError(f"max_operand must be >= 1, got {self.max_operand}")
    if not self.ops or set(self.ops) - set(_PREC):
      raise ValueError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")
    if self.extra_turns < 0:
      raise ValueError(f"extra_turns must be >= 0, got {self.extra_turns}")
    if self.max_observation_chars < 8:
      raise ValueError(f"max_observation_chars must be >= 8, got {self.max_observation_chars}")

  # --- sizes --------------------------------------------------------------------------
  @property
  def fmt(self) -> ToolFormat:
    return ToolFormat(self.call_open, self.call_close)

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"num_ops": ()}

  @property
  def max_turns(self) -> int:
    return self.max_ops + 1 + self.extra_turns

  @property
  def _max_value(self) -> int:
    """An upper bound of every value of an expression with `max_ops` operations."""
    bound = [0, self.max_operand]  # bound[k]: k leaves
    for k in range(2, self.max_ops + 2):
      bound.append(max(max(bound[i] * bound[k - i], bound[i] + bound[k - i])
                       for i in range(1, k)))
    return max(bound)

  @property
  def max_prompt_chars(self) -> int:
    n, d = self.max_ops, len(str(self.max_operand))
    return (n + 1) * d + n + 2 * (n - 1) + len("=?")

  @property
  def max_action_chars(self) -> int:
    d = len(str(self._max_value))
    return len(self.fmt.call("calc", "9" * d + "+" + "9" * d))

  @property
  def max_response_chars(self) -> int:
    return self.max_action_chars

  # --- examples -----------------------------------------------------------------------
  def _tree(self, rng: np.random.Generator, n: int) -> Tree:
    if n == 0:
      return int(rng.integers(1, self.max_operand + 1))
    n_left = int(rng.integers(0, n))
    left, right = self._tree(rng, n_left), self._tree(rng, n - 1 - n_left)
    op = self.ops[int(rng.integers(len(self.ops)))]
    if op == "-" and evaluate(left) < evaluate(right):
      left, right = right, left
    return (op, left, right)

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      k = int(rng.integers(self.min_ops, self.max_ops + 1))
      tree = self._tree(rng, k)
      out.append({"prompt": render(tree) + "=?", "answer": str(evaluate(tree)), "num_ops": k})
    return out

  def tree(self, example: Mapping[str, Any]) -> Tree:
    prompt = text_field(example, "prompt")
    if not prompt.endswith("=?"):
      raise ValueError(f"not a calculator prompt: {prompt!r}")
    return parse(prompt[:-2])

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    """1.0 when `response` is the answer turn `answer(<the expression's value>)`."""
    act = parse_action(response, self.fmt, {"calc": 1})
    return float(act.kind == ANSWER and act.args[0] == text_field(example, "answer"))

  def demonstration_turns(self, example: Mapping[str, Any],
                          rng: np.random.Generator | None = None) -> list[str]:
    """The actions of a demonstration episode: the leftmost reducible operation each turn;
    with `rng` and `demo_truncate` > 0, sometimes the truncating demonstrator's (class
    docstring)."""
    tree, turns = self.tree(example), []
    slips = rng is not None and self.demo_truncate > 0 and rng.random() < self.demo_truncate
    while not isinstance(tree, int):
      op, a, b = reducible(tree)[0]
      ra, rb = (_first_digit(a), _first_digit(b)) if slips else (a, b)
      turns.append(self.fmt.call("calc", f"{ra}{op}{rb}"))
      if (ra, rb) == (a, b):
        tree, _ = reduce_once(tree, (op, a, b))
      else:  # the wrong value, carried on
        tree = _replace_leftmost(tree, (op, a, b), _APPLY[op](ra, rb))
    return turns + [self.fmt.answer(str(tree))]

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    del rng
    return self.fmt.answer(text_field(example, "answer"))

  def make_env(self, example: Mapping[str, Any], limits: Limits | None = None
               ) -> "CalculatorEnv":
    return CalculatorEnv(self.tree(example), task_limits(self, limits), self.fmt,
                         show_state=self.show_state)


class CalculatorEnv(TextEnv):
  """One `calculator` episode. State: the current expression tree."""
  tools = {"calc": 1}

  def __init__(self, tree: Tree, limits: Limits, fmt: ToolFormat = ToolFormat(),
               show_state: bool = True):
    super().__init__(limits, fmt)
    self.tree, self.show_state = tree, show_state
    self.num_ops = count_ops(tree)
    self.value = evaluate(tree)
    self.prompt = render(tree) + "=?"
    self.gold_answer = fmt.answer(str(self.value))

  def _initial_state(self) -> Tree:
    return self.tree

  def _progress(self, state: Tree) -> float:
    if self.num_ops == 0:
      return 1.0
    return (self.num_ops - count_ops(state)) / self.num_ops

  def _gold_calls(self, state: Tree) -> tuple[str, ...]:
    if isinstance(state, int):
      return (self.fmt.answer(str(state)),)
    return tuple(self.fmt.call("calc", f"{a}{op}{b}") for op, a, b in reducible(state))

  def _act(self, state: Tree, action: Action) -> tuple[Any, Turn]:
    gold = self._gold_calls(state)
    if action.kind == ANSWER:
      ok = action.args[0] == str(self.value)
      return state, Turn("", correct=ok, outcome=float(ok),
                         info={"gold_calls": gold, "value": None})
    m = _CALL.fullmatch(action.args[0])
    if m is None:
      return state, Turn("error: write calc(a+b), one operation", correct=False,
                         info={"gold_calls": gold, "value": None, "valid": False})
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    value = _APPLY[op](a, b)
    options = reducible(state)
    target = None
    if (op, a, b) in options:
      target = (op, a, b)
    elif op in "+*" and (op, b, a) in options:
      target = (op, b, a)
    if target is not None:
      state, _ = reduce_once(state, target)
    obs = f"{value}; now {render(state)}" if self.show_state else str(value)
    return state, Turn(obs, reward=float(target is not None), correct=target is not None,
                       info={"gold_calls": gold, "value": value})
