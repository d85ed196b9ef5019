"""The Python sandbox (credit/envs/sandbox.py): hostile programs end in a clear failed result,
the caller goes on, and nothing outside the scratch directory is read or written.

Every case runs one short-lived interpreter under small limits (a second of CPU time, a few
seconds of wall time), so the file costs seconds. The verifier's secret lives in a temporary
directory of the test, outside the sandbox's scratch directory, as unit tests would.
"""
import os
import threading

import pytest

from credit.envs.sandbox import BLOCKED_EXIT, SandboxLimits, SandboxResult, run_python

FAST = SandboxLimits(cpu_s=1, wall_s=4, memory_bytes=256 * 2**20, file_bytes=64 * 1024,
                     max_output_chars=256)


@pytest.fixture
def verifier(tmp_path):
  """A verifier's directory outside the scratch directory: its secret file and a module."""
  (tmp_path / "expected.txt").write_text("f(7)=58\n")
  (tmp_path / "verifier_tests.py").write_text("EXPECTED = 58\n")
  return tmp_path


def run(program, **kw):
  res = run_python(program, limits=kw.pop("limits", FAST), **kw)
  assert isinstance(res, SandboxResult) and isinstance(res.detail, str)
  return res


def test_a_plain_program_runs_with_the_standard_library_stdin_and_scratch_files():
  res = run("import json, collections, os, re, math, random, tempfile\n"
            "open('note.txt', 'w').write(input()[::-1])\n"
            "with tempfile.TemporaryDirectory() as d:\n"
            "  open(os.path.join(d, 'x'), 'w').write('1')\n"
            "print(open('note.txt').read(), open('given.txt').read())",
            stdin="olleh", files={"given.txt": "world"})
  assert res.ok and res.stdout == "hello world\n" and res.returncode == 0, res
  assert not res.truncated and res.detail == ""


def test_the_environment_is_scrubbed_and_the_working_directory_is_private():
  os.environ["CREDIT_SANDBOX_TEST_SECRET"] = "leak"
  try:
    res = run("import os, sys\nprint(sorted(os.environ)); print(os.getcwd()); print(sys.path)")
  finally:
    del os.environ["CREDIT_SANDBOX_TEST_SECRET"]
  assert res.ok, res
  env, cwd, path = res.stdout.splitlines()
  assert "CREDIT_SANDBOX_TEST_SECRET" not in env and "HOME" in env
  assert "credit-sandbox-" in cwd and not os.path.exists(cwd)  # removed after the call
  assert "site-packages" not in path and os.getcwd() not in path


@pytest.mark.parametrize("program, status, detail", [
    ("while True: pass", "cpu_limit", "CPU time"),
    ("import os\nwhile True:\n  os.fork()", "blocked", "os.fork"),
    ("while True: print('x' * 10000)", "output_limit", "bytes of output"),
    ("x = bytearray(2**30)", "memory_limit", "memory"),
    ("1 / 0", "error", "ZeroDivisionError"),
    ("def f(:\n  pass", "error", "SyntaxError"),
    ("import socket\nsocket.socket()", "blocked", "no network"),
    ("import subprocess\nsubprocess.run(['cat', '/etc/hostname'])", "blocked", "_posixsubprocess"),
    ("import os\nos.system('true')", "blocked", "os.system"),
    ("import ctypes", "blocked", "import ctypes"),
    ("import os\nos.kill(os.getppid(), 9)", "blocked", "os.kill"),
    ("import gc\ngc.get_objects()", "blocked", "gc.get_objects"),
])
def test_a_hostile_program_ends_in_a_clear_failed_result(program, status, detail):
  res = run(program)
  assert res.status == status and detail in res.detail, res
  assert not res.ok
  if status == "blocked":
    assert res.returncode == BLOCKED_EXIT and res.detail.startswith("sandbox: blocked")


def test_huge_output_comes_back_capped():
  res = run("import sys\nsys.stdout.write('y' * 50000)\nprint('tail', file=sys.stderr)")
  assert res.ok and res.truncated and res.stdout == "y" * FAST.max_output_chars, res.status


def test_a_sleeping_program_is_killed_at_the_wall_time():
  res = run("import time\ntime.sleep(60)", limits=SandboxLimits(cpu_s=1, wall_s=1))
  assert res.status == "timeout" and res.returncode is None and res.seconds < 10, res


def test_writes_outside_the_scratch_directory_are_blocked(verifier):
  outside = verifier / "pwned.txt"
  for program in (f"open({str(outside)!r}, 'w').write('x')",
                  f"import os\nos.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT)",
                  f"import os\nos.remove({str(verifier / 'expected.txt')!r})",
                  f"import os\nos.rename({str(verifier / 'expected.txt')!r}, 'mine.txt')",
                  f"import shutil\nshutil.rmtree({str(verifier)!r})",
                  f"import os\nos.symlink({str(verifier)!r}, 'link')\n"
                  "open('link/pwned.txt', 'w').write('x')",
                  f"import os\nos.chdir({str(verifier)!r})"):
    res = run(program)
    assert res.status == "blocked" and "outside the scratch directory" in res.detail, (program,
                                                                                     res)
  assert not outside.exists() and (verifier / "expected.txt").read_text() == "f(7)=58\n"


def test_the_verifiers_files_cannot_be_read(verifier):
  secret = str(verifier / "expected.txt")
  for program in (f"print(open({secret!r}).read())",
                  f"try:\n  open({secret!r})\nexcept BaseException:\n  print('caught')",
                  f"import pathlib\nprint(pathlib.Path({secret!r}).read_text())",
                  f"import sys\nsys.path.insert(0, {str(verifier)!r})\nimport verifier_tests",
                  f"import os\nprint(os.listdir({str(verifier)!r}))",
                  "print(open('/proc/self/environ').read())",
                  "print(open('/etc/passwd').read())"):
    res = run(program)
    assert res.status == "blocked", (program, res)
    assert "58" not in res.stdout and "caught" not in res.stdout


def test_the_caller_goes_on_and_concurrent_calls_are_independent():
  """Hostile and plain programs from several threads at once (as `call_all` runs them): each
  gets its own result, and the calling process is unharmed."""
  programs = ["print(1)", "while True: pass", "import os\nos.fork()", "print(2)"]
  out = [None] * len(programs)

  def one(i):
    out[i] = run(programs[i])

  threads = [threading.Thread(target=one, args=(i,)) for i in range(len(programs))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert [r.status for r in out] == ["ok", "cpu_limit", "blocked", "ok"]
  assert out[0].stdout == "1\n" and out[3].stdout == "2\n"


def test_bad_arguments_are_refused_naming_them():
  with pytest.raises(ValueError, match="SandboxLimits.cpu_s must be > 0"):
    SandboxLimits(cpu_s=0)
  with pytest.raises(ValueError, match="SandboxLimits.memory_bytes must be >="):
    SandboxLimits(memory_bytes=2**20)
  with pytest.raises(ValueError, match="files: '../x' must be a relative path"):
    run_python("print(1)", files={"../x": "1"})
