"""Program synthesis from examples, run against unit tests (VeRPO's setting, in miniature).

The prompt shows a few input/output pairs of an integer function, and the response writes
the function's body as an expression over `x` in a tiny language that this module
interprets itself (never Python's `exec`/`eval`). The response is then run on the task's
unit tests: the shown inputs and held-out ones (zero, large inputs), each with its own
difficulty for the policy. Prompt "f(1)=3,f(2)=5,f(3)=7;f(x)=", a correct response
"2*x+1".

The language (whitespace ignored):

  expr  := sum ('?' expr ':' expr)?      c?a:b  is a when c ≠ 0, else b
  sum   := prod (('+' | '-') prod)*
  prod  := unary (('*' | '/') unary)*     '/' is floor division
  unary := '-' unary | atom
  atom  := NUMBER | 'x' | 'f' '(' expr ')' | '(' expr ')'

`f(e)` calls the program itself (recursion: "x?f(x-1)+2:1" is 2x+1 for x ≥ 0), so a
candidate can fail to terminate ("f(x)", "f(x+1)"). Running a candidate never raises and
never hangs: every evaluation step counts against `max_steps`, calls nest at most
`max_call_depth` deep, values beyond ±`max_value` stop the run, and each outcome is
reported — `ok`, `syntax error: ...`, `runtime error: division by zero`,
`step limit exceeded`, `call depth exceeded`, `overflow`. A test passes when the run is
`ok` and its value equals the expected output; any error fails every test it touches.

Rewards: `verify` is the outcome (1 when every unit test passes); `run_tests` gives the
per-test results (`test_pass [U]` for VeRPO's difficulty-weighted dense reward, through the
runner's `unit_tests` producer).

Target functions (a family per `family`): "linear" a·x + b (a in [1, max_coef], b in
[0, max_const]); "quadratic" x·x + a·x + b (a in [0, max_coef]); "mixed" either. The
demonstration writes the canonical expression ("2*x+1", "x*x+3", "x*x+2*x+1").

Held-out functions (`eval_function_fraction` φ, default 0.2): the family's target functions
are split once, by a fixed rule that no seed enters, into train and eval functions;
`generate` draws only train functions and `generate_eval` (the runner's eval split) only
eval functions, so held-out accuracy asks for functions the policy never trained on. The
rule, per kind (linear, quadratic) with n functions: order them by the SHA-256 of their
canonical expression and hold out the first round(φ·n) (half to even), at least 1 and at
most n − 1. A function's side therefore does not depend on the family: "mixed" holds out
exactly the held-out functions of "linear" and of "quadratic" (defaults: 6 of 30 linear, 8
of 40 quadratic). φ = 0 is the former shared draw (train and eval from every function).
The tfds builder (`credit_tasks`) draws its test split with `generate_eval` too.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from credit.tasks.base import register_task, text_field

FAMILIES = ("linear", "quadratic", "mixed")
# A target function: f(x) = (x·x if quad) + a·x + b.
Function = tuple[int, int, bool]


class RunResult(NamedTuple):
  """One run of a candidate on one input: `value` when `status == "ok"`, else None."""
  value: int | None
  status: str


class _Stop(Exception):
  """Ends a run with a status (syntax / runtime error, limits)."""


def _lex(text: str) -> list[str]:
  toks, i = [], 0
  while i < len(text):
    c = text[i]
    if c in " \n\t":
      i += 1
    elif c.isdigit():
      j = i
      while j < len(text) and text[j].isdigit():
        j += 1
      if j - i > 9:
        raise _Stop("syntax error: number literal longer than 9 digits")
      toks.append(text[i:j])
      i = j
    elif c in "+-*/()?:xf":
      toks.append(c)
      i += 1
    else:
      raise _Stop(f"syntax error: unexpected character {c!r} at {i}")
  return toks


def parse_program(text: str) -> tuple:
  """The syntax tree of a program (nested tuples), or `_Stop("syntax error: ...")`.

  Nodes: ("num", v), ("x",), ("neg", e), ("bin", op, a, b), ("if", c, a, b), ("call", e).
  Nesting deeper than 64 is a syntax error (so parsing never exhausts Python's stack).
  """
  toks, pos = _lex(text), [0]
  if not toks:
    raise _Stop("syntax error: empty program")

  def peek():
    return toks[pos[0]] if pos[0] < len(toks) else None

  def take(want: str | None = None) -> str:
    tok = peek()
    if tok is None:
      raise _Stop("syntax error: unexpected end of program")
    if want is not None and tok != want:
      raise _Stop(f"syntax error: expected {want!r}, got {tok!r}")
    pos[0] += 1
    return tok

  def expr(depth):
    if depth > 64:
      raise _Stop("syntax error: nested deeper than 64")
    cond = sum_(depth)
    if peek() == "?":
      take()
      a = expr(depth + 1)
      take(":")
      return ("if", cond, a, expr(depth + 1))
    return cond

  def sum_(depth):
    node = prod(depth)
    while peek() in ("+", "-"):
      op = take()
      node = ("bin", op, node, prod(depth))
    return node

  def prod(depth):
    node = unary(depth)
    while peek() in ("*", "/"):
      op = take()
      node = ("bin", op, node, unary(depth))
    return node

  def unary(depth):
    if peek() == "-":
      take()
      if depth > 64:
        raise _Stop("syntax error: nested deeper than 64")
      return ("neg", unary(depth + 1))
    return atom(depth)

  def atom(depth):
    tok = take()
    if tok.isdigit():
      return ("num", int(tok))
    if tok == "x":
      return ("x",)
    if tok == "f":
      take("(")
      arg = expr(depth + 1)
      take(")")
      return ("call", arg)
    if tok == "(":
      node = expr(depth + 1)
      take(")")
      return node
    raise _Stop(f"syntax error: unexpected {tok!r}")

  tree = expr(0)
  if peek() is not None:
    raise _Stop(f"syntax error: unexpected {peek()!r} after the expression")
  return tree


def run_program(program: str, x: int, *, max_steps: int = 2000, max_call_depth: int = 32,
                max_value: int = 10**9) -> RunResult:
  """Runs `program` on input `x` under the limits; never raises, never hangs.

  >>> run_program("x?f(x-1)+2:1", 3)
  RunResult(value=7, status='ok')
  >>> run_program("f(x+1)", 0).status
  'call depth exceeded'
  >>> run_program("x/(x-x)", 2).status
  'runtime error: division by zero'
  """
  try:
    tree = parse_program(program)
  except _Stop as e:
    return RunResult(None, str(e))
  steps = [0]

  def ev(node, xv, depth):
    steps[0] += 1
    if steps[0] > max_steps:
      raise _Stop("step limit exceeded")
    kind = node[0]
    if kind == "num":
      v = node[1]
    elif kind == "x":
      v = xv
    elif kind == "neg":
      v = -ev(node[1], xv, depth)
    elif kind == "if":
      v = ev(node[2], xv, depth) if ev(node[1], xv, depth) != 0 else ev(node[3], xv, depth)
    elif kind == "call":
      if depth >= max_call_depth:
        raise _Stop("call depth exceeded")
      v = ev(tree, ev(node[1], xv, depth), depth + 1)
    else:
      a, b = ev(node[2], xv, depth), ev(node[3], xv, depth)
      op = node[1]
      if op == "/" and b == 0:
        raise _Stop("runtime error: division by zero")
      v = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a // b
    if abs(v) > max_value:
      raise _Stop("overflow")
    return v

  try:
    return RunResult(int(ev(tree, int(x), 0)), "ok")
  except _Stop as e:
    return RunResult(None, str(e))
  except RecursionError:  # not reachable under the default limits; a guard all the same
    return RunResult(None, "call depth exceeded")


@register_task("program")
@dataclasses.dataclass(frozen=True)
class Program:
  """Write `f(x)` from a few of its input/output pairs; scored by unit tests.

  Attributes:
    family: "linear" (a·x + b), "quadratic" (x·x + a·x + b) or "mixed" (either, evenly).
    max_coef: a is drawn in [1, max_coef] (quadratic: [0, max_coef]).
    max_const: b is drawn in [0, max_const].
    shown: how many of the test inputs the prompt shows (the first ones; the remaining
      tests are held out).
    test_inputs: the unit tests' inputs, the same for every example (U = len); shown
      first, then held out.
    max_steps, max_call_depth: the interpreter's limits per test (see `run_program`).
    eval_function_fraction: φ in [0, 1), the share of each kind's target functions held out
      for `generate_eval` (module docstring); 0 = train and eval draw from every function.
  """
  family: str = "linear"
  max_coef: int = 3
  max_const: int = 9
  shown: int = 3
  test_inputs: tuple[int, ...] = (1, 2, 3, 0, 7)
  max_steps: int = 2000
  max_call_depth: int = 32
  eval_function_fraction: float = 0.2
  name = "program"

  def __post_init__(self):
    object.__setattr__(self, "test_inputs", tuple(int(v) for v in self.test_inputs))  # JSON
    if self.family not in FAMILIES:
      raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
    if self.max_coef < 1 or self.max_const < 0:
      raise ValueError(f"Need max_coef >= 1 and max_const >= 0, got {self.max_coef}, "
                       f"{self.max_const}")
    if not 1 <= self.shown <= len(self.test_inputs):
      raise ValueError(f"Need 1 <= shown <= len(test_inputs) = {len(self.test_inputs)}, "
                       f"got {self.shown}")
    if any(not 0 <= v <= 99 for v in self.test_inputs):
      raise ValueError(f"test_inputs must lie in [0, 99], got {self.test_inputs}")
    if self.max_steps < 1 or self.max_call_depth < 1:
      raise ValueError("max_steps and max_call_depth must be >= 1")
    frac = self.eval_function_fraction
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
      raise ValueError(f"eval_function_fraction must be a number in [0, 1), got {frac!r}")
    if frac > 0:
      for quad in self._kinds:
        n = len(_all_functions(self.max_coef, self.max_const, quad))
        if n < 2:
          raise ValueError(
              f"eval_function_fraction={frac} needs >= 2 {'quadratic' if quad else 'linear'} "
              f"functions to split, but max_coef={self.max_coef}, max_const="
              f"{self.max_const} give {n}; raise them or set eval_function_fraction=0")

  @property
  def _kinds(self) -> tuple[bool, ...]:
    """The kinds of the family as `quad` flags (linear False, quadratic True)."""
    return {"linear": (False,), "quadratic": (True,), "mixed": (False, True)}[self.family]

  def functions(self, split: str = "all") -> tuple[Function, ...]:
    """The family's target functions (a, b, quad) on one side of the split, in the fixed
    order of the rule: "train", "eval" or "all" (train then eval, per kind)."""
    if split not in ("train", "eval", "all"):
      raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
    out: list[Function] = []
    for quad in self._kinds:
      train, held = _split_functions(self.max_coef, self.max_const, quad,
                                     float(self.eval_function_fraction))
      out += (train if split == "train" else held if split == "eval" else train + held)
    return tuple(out)

  @property
  def num_tests(self) -> int:
    return len(self.test_inputs)

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"outputs": (self.num_tests,)}

  def _f(self, a: int, b: int, quad: bool, x: int) -> int:
    return x * x + a * x + b if quad else a * x + b

  @property
  def max_prompt_chars(self) -> int:
    quad = self.family != "linear"
    shown = self.test_inputs[:self.shown]
    pairs = sum(len(f"f({v})={self._f(self.max_coef, self.max_const, quad, v)}")
                for v in shown)
    return pairs + (self.shown - 1) + len(";f(x)=")

  @property
  def max_response_chars(self) -> int:
    return len(f"x*x+{self.max_coef}*x+{self.max_const}")

  def _example(self, a: int, b: int, quad: bool) -> dict:
    ys = [self._f(a, b, quad, v) for v in self.test_inputs]
    shown = ",".join(f"f({v})={y}" for v, y in list(zip(self.test_inputs, ys))[:self.shown])
    return {"prompt": shown + ";f(x)=", "answer": _canonical(a, b, quad), "outputs": ys}

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    """`n` examples of train functions: the kind by a fair coin ("mixed"), then a function
    of that kind uniformly (φ = 0: a uniform in its range, b uniform in [0, max_const])."""
    out = []
    for _ in range(n):
      quad = (self.family == "quadratic"
              or (self.family == "mixed" and bool(rng.integers(2))))
      if self.eval_function_fraction == 0:  # the former draw, stream for stream
        a = int(rng.integers(0 if quad else 1, self.max_coef + 1))
        b = int(rng.integers(0, self.max_const + 1))
      else:
        pool = _split_functions(self.max_coef, self.max_const, quad,
                                float(self.eval_function_fraction))[0]
        a, b, _ = pool[int(rng.integers(len(pool)))]
      out.append(self._example(a, b, quad))
    return out

  def generate_eval(self, rng: np.random.Generator, n: int) -> list[dict]:
    """`n` held-out examples: the eval functions, each pass over them in a fresh random
    order (so each is asked equally often, ±1); φ = 0: `generate`."""
    if self.eval_function_fraction == 0:
      return self.generate(rng, n)
    held = self.functions("eval")
    out: list[dict] = []
    while len(out) < n:
      out += [self._example(*held[i]) for i in rng.permutation(len(held))[:n - len(out)]]
    return out

  def run_tests(self, example: Mapping[str, Any], response: str) -> list[RunResult]:
    """The response run on every unit test input (one `RunResult` per test)."""
    return [run_program(response.strip(), v, max_steps=self.max_steps,
                        max_call_depth=self.max_call_depth) for v in self.test_inputs]

  def test_pass(self, example: Mapping[str, Any], response: str) -> list[float]:
    """[U] 1.0 for each unit test the response passes (value equals the expected output)."""
    want = [int(v) for v in np.asarray(example["outputs"]).reshape(-1)]
    return [float(r.status == "ok" and r.value == y)
            for r, y in zip(self.run_tests(example, response), want)]

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    return float(all(self.test_pass(example, response)))

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    return text_field(example, "answer")


def _canonical(a: int, b: int, quad: bool) -> str:
  terms = ["x*x"] if quad else []
  if a:
    terms.append("x" if a == 1 else f"{a}*x")
  if b or not terms:
    terms.append(str(b))
  return "+".join(terms)


@functools.lru_cache(maxsize=None)
def _all_functions(max_coef: int, max_const: int, quad: bool) -> tuple[Function, ...]:
  """Every target function of one kind, a ascending then b ascending."""
  return tuple((a, b, quad) for a in range(0 if quad else 1, max_coef + 1)
               for b in range(max_const + 1))


def _split_key(fn: Function) -> bytes:
  return hashlib.sha256(("program:" + _canonical(*fn)).encode()).digest()


@functools.lru_cache(maxsize=None)
def _split_functions(max_coef: int, max_const: int, quad: bool, fraction: float
                     ) -> tuple[tuple[Function, ...], tuple[Function, ...]]:
  """(train, eval) functions of one kind: ordered by the SHA-256 of the canonical expression,
  the first round(fraction·n) (clipped to [1, n − 1]; none at fraction 0) are held out."""
  fns = sorted(_all_functions(max_coef, max_const, quad), key=_split_key)
  k = 0 if fraction == 0 else min(max(int(round(fraction * len(fns))), 1), len(fns) - 1)
  return tuple(fns[k:]), tuple(fns[:k])


def pass_table(task: Program, examples: Sequence[Mapping[str, Any]],
               responses: Sequence[str]) -> np.ndarray:
  """[B,U] float32 unit-test results of `responses` against `examples` (row-aligned)."""
  return np.asarray([task.test_pass(e, r) for e, r in zip(examples, responses)], np.float32
                    ).reshape(len(responses), task.num_tests)
