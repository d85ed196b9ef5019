"""`python_program`: program synthesis from examples, the programs run in the Python sandbox.

The setting of `credit.tasks.Program` (the same target functions, the same held-out split,
the same unit-test inputs), but the response is a real Python program that defines `f`,
run by `credit.envs.sandbox.run_python` instead of a tiny interpreter:

  prompt    "f(1)=5,f(2)=7,f(3)=9;python:"
  response  "def f(x):\\n return 2*x+3"

The unit tests call `f` on every test input (the shown ones, then the held-out ones) in one
sandboxed run per response: a harness (`main.py`) loads the response from `solution.py` in
the scratch directory, calls `f(x)` for each input under a per-test timer, and prints the
results as one marked JSON line (after a test times out, the later ones are not run and fail
as timed out, so an endless program costs one timer, not U). Only the inputs enter the
sandbox; the expected outputs stay with the caller, which compares `repr(f(x))` with
`repr(expected)` (so `7.0` does not pass for `7`). Whatever the program does (a syntax
error, an exception, an endless loop, a fork bomb, gigabytes of output, reading the
verifier's files), the failing tests fail and the run goes on; a run that ends without the
results line (blocked, out of CPU time or memory) fails every test with the sandbox's
status.

A program can print the results line itself, but it learns nothing it could use that way:
the expected outputs of the held-out tests never enter the sandbox, so a forged line
passes only what the program could have computed.

Rewards: `verify` is 1 when every test passes (`reward="all_pass"`, the default) or the
fraction passed (`reward="fraction"`); `test_pass` gives the `[U]` pass vector that the
runner's `unit_tests` producer turns into `test_pass` / `test_mask` (VeRPO's
difficulty-weighted tests, `verpo_tests`), and the `tests` reward component. A run's results
are cached per (program, inputs), so the reward and the unit tests of one response cost one
sandboxed run; `verify_many` runs a batch's programs concurrently (`credit.envs.calls`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from credit.envs.calls import call_all
from credit.envs.sandbox import SandboxLimits, run_python
from credit.tasks.base import register_task
from credit.tasks.program import Program

__all__ = ["CaseResult", "PythonProgram", "run_cases"]

REWARDS = ("all_pass", "fraction")
_MARK = "@@credit-unit-tests@@"
_SOLUTION = "solution.py"

# The harness: reads the inputs (JSON on stdin), loads the solution, calls f on each input
# under a per-test timer, prints one marked line of [status, repr] pairs. The references it
# needs are taken before the solution runs, so a solution that rebinds them does not matter.
_HARNESS = r'''
import io, json, os, signal, sys
_dumps, _write, _setitimer, _REAL = json.dumps, os.write, signal.setitimer, signal.ITIMER_REAL
cfg = json.loads(sys.stdin.read())


class _Timeout(BaseException):
  pass


def _alarm(signum, frame):
  raise _Timeout()


signal.signal(signal.SIGALRM, _alarm)
sys.stdout = io.StringIO()  # the solution's prints stay out of the results
ns, error = {"__name__": "solution"}, None
try:
  _setitimer(_REAL, cfg["per_test_s"])
  with open(cfg["solution"]) as fh:
    exec(compile(fh.read(), cfg["solution"], "exec"), ns)
  _setitimer(_REAL, 0)
  if not callable(ns.get(cfg["fn"])):
    error = "error: no function " + cfg["fn"]
except _Timeout:
  error = "timeout"
except BaseException as e:  # the solution's own errors (SyntaxError, SystemExit, ...)
  error = "error: " + type(e).__name__
finally:
  _setitimer(_REAL, 0)
out = []
for x in cfg["inputs"]:
  if error is not None:
    out.append([error, ""])
    continue
  try:
    _setitimer(_REAL, cfg["per_test_s"])
    out.append(["ok", repr(ns[cfg["fn"]](x))[:200]])
  except _Timeout:
    out.append(["timeout", ""])
    error = "timeout: an earlier test timed out"  # one endless program costs one timer
  except BaseException as e:
    out.append(["error: " + type(e).__name__, ""])
  finally:
    _setitimer(_REAL, 0)
_write(1, ("\n" + cfg["mark"] + _dumps(out) + "\n").encode())
'''


class CaseResult(NamedTuple):
  """One unit test's run: `status` "ok" with `value` = repr(f(x)), or why it failed
  ("error: ZeroDivisionError", "timeout", or the whole run's sandbox status, e.g.
  "blocked: sandbox: blocked os.fork")."""
  status: str
  value: str = ""


@functools.lru_cache(maxsize=8192)
def run_cases(program: str, inputs: tuple, *, fn: str = "f", per_test_s: float = 1.0,
              limits: SandboxLimits = SandboxLimits()) -> tuple[CaseResult, ...]:
  """`fn(x)` of `program` for every x in `inputs`, in one sandboxed run (module docstring);
  cached. Never raises on what the program does.

  >>> [r.value for r in run_cases("def f(x):\\n return 2*x+1", (1, 2))]  # doctest: +SKIP
  ['3', '5']
  """
  cfg = {"inputs": list(inputs), "fn": fn, "per_test_s": float(per_test_s), "mark": _MARK,
         "solution": _SOLUTION}
  res = run_python(_HARNESS, stdin=json.dumps(cfg), limits=limits, files={_SOLUTION: program})
  lines = [ln for ln in res.stdout.splitlines() if ln.startswith(_MARK)]
  if lines:
    try:
      rows = json.loads(lines[-1][len(_MARK):])
      if len(rows) == len(inputs):
        return tuple(CaseResult(str(s), str(v)) for s, v in rows)
    except (ValueError, TypeError):
      pass
  why = res.status if res.status != "ok" else "error: no results"
  detail = f"{why}: {res.detail}" if res.detail else why
  return tuple(CaseResult(detail) for _ in inputs)


@register_task("python_program")
@dataclasses.dataclass(frozen=True)
class PythonProgram(Program):
  """Write `f` in Python from a few of its input/output pairs; unit tests run in the sandbox.

  Attributes (beyond `Program`'s, whose `max_steps` / `max_call_depth` do not apply here):
    reward: "all_pass" (1 when every test passes) or "fraction" (tests passed / U).
    per_test_s: seconds of one call of f (a timer inside the sandbox).
    cpu_s, wall_s, memory_mb: the limits of one run (every test of one response).
    max_workers: programs run at once by `verify_many`.
  """
  reward: str = "all_pass"
  per_test_s: float = 1.0
  cpu_s: float = 5.0
  wall_s: float = 20.0
  memory_mb: int = 512
  max_workers: int = 4
  name = "python_program"

  def __post_init__(self):
    super().__post_init__()
    if self.reward not in REWARDS:
      raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
    if not self.per_test_s > 0 or self.max_workers < 1:
      raise ValueError(f"need per_test_s > 0 and max_workers >= 1, got {self.per_test_s}, "
                       f"{self.max_workers}")
    _ = self.limits  # checks cpu_s, wall_s and memory_mb

  @property
  def limits(self) -> SandboxLimits:
    return SandboxLimits(cpu_s=self.cpu_s, wall_s=self.wall_s,
                         memory_bytes=int(self.memory_mb) * 2**20)

  @property
  def max_prompt_chars(self) -> int:
    return super().max_prompt_chars - len(";f(x)=") + len(";python:")

  @property
  def max_response_chars(self) -> int:
    return len(_program("x")) - 1 + super().max_response_chars

  def _example(self, a: int, b: int, quad: bool) -> dict:
    ex = super()._example(a, b, quad)
    return {"prompt": ex["prompt"][:-len(";f(x)=")] + ";python:",
            "answer": _program(ex["answer"]), "outputs": ex["outputs"]}

  def run_tests(self, example: Mapping[str, Any], response: str) -> list[CaseResult]:
    """The response run on every unit test input (one `CaseResult` per test)."""
    del example
    return list(run_cases(response, self.test_inputs, per_test_s=self.per_test_s,
                          limits=self.limits))

  def test_pass(self, example: Mapping[str, Any], response: str) -> list[float]:
    """[U] 1.0 for each unit test whose `repr(f(x))` equals the expected output's."""
    want = [int(v) for v in np.asarray(example["outputs"]).reshape(-1)]
    return [float(r.status == "ok" and r.value == repr(y))
            for r, y in zip(self.run_tests(example, response), want)]

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    passed = self.test_pass(example, response)
    return float(np.mean(passed)) if self.reward == "fraction" else float(all(passed))

  def verify_many(self, examples: Sequence[Mapping[str, Any]], responses: Sequence[str]
                  ) -> list[float]:
    """`verify` of each (example, response) pair, the programs run `max_workers` at a time
    (each run is its own process, so threads only wait)."""
    distinct = list(dict.fromkeys(responses))
    call_all([functools.partial(self.run_tests, None, r) for r in distinct],
             max_workers=self.max_workers)  # fills the cache; errors are the runs' own
    return [self.verify(e, r) for e, r in zip(examples, responses)]


def _program(body: str) -> str:
  return f"def f(x):\n return {body}"
