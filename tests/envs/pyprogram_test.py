"""`python_program` (credit/envs/pyprogram.py): Python programs from examples, run on unit
tests in the sandbox; the pass vectors feed the unit-test shaping method (verpo_tests)."""
import numpy as np
import pytest

from credit.advantages.shaping.verpo_tests import verpo_tests_advantages
from credit.envs.pyprogram import PythonProgram, run_cases
from credit.tasks import CharTokenizer, Program, get_task, verify_batch

FAST = dict(per_test_s=0.5, cpu_s=2.0, wall_s=8.0)


@pytest.fixture(scope="module")
def task():
  return get_task("python_program", family="mixed", **FAST)


@pytest.fixture(scope="module")
def example(task):
  return next(e for e in task.generate(np.random.default_rng(0), 20)
             if e["answer"].endswith("2*x+1"))  # f(x) = x*x+2*x+1: outputs 4 9 16 1 64


def test_examples_are_programs_of_the_program_tasks_functions(task):
  ours = task.generate(np.random.default_rng(3), 30)
  theirs = Program(family="mixed").generate(np.random.default_rng(3), 30)
  tok = CharTokenizer()
  for a, b in zip(ours, theirs):
    assert a["outputs"] == b["outputs"] and a["answer"] == f"def f(x):\n return {b['answer']}"
    assert a["prompt"] == b["prompt"].replace(";f(x)=", ";python:")
    assert len(a["prompt"]) <= task.max_prompt_chars
    assert len(a["answer"]) <= task.max_response_chars
    tok.encode(a["prompt"] + a["answer"])  # in the character tokenizer's vocabulary
  held = {e["answer"] for e in task.generate_eval(np.random.default_rng(1), 40)}
  assert not held & {e["answer"] for e in task.generate(np.random.default_rng(2), 200)}


def test_pass_vectors_and_rewards(task, example):
  assert task.test_pass(example, example["answer"]) == [1.0] * 5
  assert task.verify(example, example["answer"]) == 1.0
  # x*x+1 agrees with x*x+2*x+1 only at x = 0 (the fourth test)
  assert task.test_pass(example, "def f(x):\n return x*x+1") == [0, 0, 0, 1, 0]
  assert task.verify(example, "def f(x):\n return x*x+1") == 0.0
  frac = get_task("python_program", family="mixed", reward="fraction", **FAST)
  assert frac.verify(example, "def f(x):\n return x*x+1") == pytest.approx(0.2)
  # a float is not the integer it equals; a helper function and prints are fine
  assert task.test_pass(example, "def f(x):\n return float(x*x+2*x+1)") == [0.0] * 5
  assert task.verify(example, "def g(x):\n return x+1\ndef f(x):\n print(x)\n return g(x)**2")


@pytest.mark.parametrize("program, status", [
    ("def f(x):\n while True: pass", "timeout"),
    ("def f(x):\n return 1 // (x - x)", "error: ZeroDivisionError"),
    ("def f(:", "error: SyntaxError"),
    ("x = 1", "error: no function f"),
    ("import os\nos.fork()\ndef f(x):\n return x", "blocked"),
    ("def f(x):\n return open('/etc/passwd').read()", "blocked"),
    ("import os\nos.write(1, b'z' * 10**7)\ndef f(x):\n return x", "output_limit"),
])
def test_a_failing_or_hostile_program_fails_its_tests_and_the_caller_goes_on(task, example,
                                                                             program, status):
  results = task.run_tests(example, program)
  assert len(results) == task.num_tests and results[0].status.startswith(status), results
  assert task.test_pass(example, program) == [0.0] * task.num_tests


def test_a_timed_out_test_stops_the_later_ones():
  res = run_cases("def f(x):\n while x: pass\n return 5", (0, 1, 0), per_test_s=0.3)
  assert [r.status for r in res] == ["ok", "timeout", "timeout: an earlier test timed out"]


def test_verify_many_agrees_with_verify_and_runs_each_program_once(task, example):
  progs = [example["answer"], "def f(x):\n return x*x+1 ", "def f(:", example["answer"]]
  run_cases.cache_clear()
  got = verify_batch(task, [example] * 4, progs)
  assert run_cases.cache_info().misses == 3  # three distinct programs
  np.testing.assert_array_equal(got, [task.verify(example, p) for p in progs])
  assert run_cases.cache_info().misses == 3  # the rows' verify hit the cache


def test_the_pass_table_feeds_the_unit_test_shaping_method(task, example):
  """test_pass rows as the runner's `unit_tests` producer stacks them, into `verpo_tests`."""
  progs = [example["answer"], "def f(x):\n return x*x+1", "def f(x):\n return 4", "def f(:"]
  passed = np.asarray([task.test_pass(example, p) for p in progs], np.float32)
  np.testing.assert_array_equal(passed.sum(1), [5, 1, 1, 0])
  out = verpo_tests_advantages(
      test_pass=passed, test_mask=np.ones_like(passed, bool), group_id=np.zeros(4, np.int32),
      response_mask=np.ones((4, 3), bool), num_groups=1)
  adv = np.asarray(out.advantages)
  assert np.isfinite(adv).all() and adv[0, 0] > adv[1, 0] > adv[3, 0]


def test_bad_options_are_refused_naming_them():
  with pytest.raises(ValueError, match="reward must be one of"):
    PythonProgram(reward="most")
  with pytest.raises(ValueError, match="SandboxLimits.cpu_s must be > 0"):
    PythonProgram(cpu_s=0)
