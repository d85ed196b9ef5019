"""A Python sandbox: each call runs a program in a fresh, limited subprocess.

`run_python(program)` writes the program to a private scratch directory and runs it as
`python -I -S -B -X utf8 -c <boot>` (isolated mode: no environment variables, no user or site
packages, no current directory on `sys.path`, no bytecode written), in a new session, with a
scrubbed environment. The boot code, before the program's first line, lowers the resource
limits and installs an audit hook (PEP 578), then executes `main.py` from the scratch
directory. The caller gets a `SandboxResult` whatever the program does; nothing it does raises
in the caller.

What the program meets:

  resource     limit                                    its result
  CPU time     RLIMIT_CPU = `cpu_s` (SIGXCPU, then      status "cpu_limit"
               SIGKILL one second later)
  memory       RLIMIT_AS = `memory_bytes`               MemoryError -> "memory_limit"
  files        RLIMIT_FSIZE = `file_bytes`, for every   a longer stdout / stderr ->
               file it writes, stdout and stderr too    "output_limit"
  processes    RLIMIT_NPROC = `max_processes`, and      a fork, exec, spawn, system or
               the audit hook refuses every way to      Popen -> "blocked"
               start one
  wall time    `wall_s` from the start; then the whole  "timeout"
               session (process group) is killed
  network      the audit hook refuses every socket      "blocked"
               event (creation, connect, bind, name
               look-ups)
  files        reads only inside the scratch directory  "blocked" (the verifier's files,
               and the interpreter's standard library;  the caller's repository, /etc, /proc
               writes, removals, renames, links,        are all outside)
               chmod / chown / utime / truncate only
               inside the scratch directory (paths
               resolved with symbolic links first)
  others       os.kill / killpg, ctypes, the raw        "blocked"
               process-spawning module, the garbage
               collector's object walks (the way to
               reach the hook itself)

A refused operation writes "sandbox: blocked <what>" to stderr and ends the program at once
(`os._exit`), so a program cannot catch the refusal and go on: the result is status "blocked"
with that line as `detail`. Other statuses: "ok" (exit code 0), "error" (another non-zero exit
code; `detail` is the last line of stderr, e.g. "ZeroDivisionError: division by zero"),
"killed" (another signal). stdout and stderr come back decoded (UTF-8, errors replaced), each
cut to `max_output_chars` (`truncated` says so). The scratch directory and everything in it
are removed after the call; `files` puts extra files there first (e.g. a solution for a test
harness to import).

Guarantees and limits. The resource limits, the wall-time kill of the process group, the
private scratch directory, the scrubbed environment and the output caps are enforced by the
operating system and hold whatever the program does. RLIMIT_NPROC counts every process of
the user, and the kernel does not apply it to root: as root (as in a container) the
process-count guarantee is the audit hook's. The audit hook is a best-effort policy inside
the program's own interpreter, not a security boundary: it stops the accidental and the usual
reward-hacking moves of a policy (reading the tests, writing elsewhere, calling out,
spawning), but a determined adversary with a memory-corruption bug in CPython or a C
extension could get past it. There is no network namespace or seccomp filter (both need
privileges). Run untrusted code from strangers in a container or VM (gVisor, nsjail,
firejail) and use this sandbox inside it. Linux only: the limits are `resource` rlimits and
descriptors are resolved through /proc/self/fd.

>>> run_python("print(6 * 7)").stdout                                   # doctest: +SKIP
'42\\n'
>>> run_python("while True: pass", limits=SandboxLimits(cpu_s=1)).status  # doctest: +SKIP
'cpu_limit'
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, NamedTuple

__all__ = ["BLOCKED_EXIT", "STATUSES", "SandboxLimits", "SandboxResult", "run_python"]

STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit", "blocked",
            "killed")
BLOCKED_EXIT = 113  # the exit code of a program ended by the audit hook
_PROGRAM = "main.py"


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """The limits of one `run_python` call.

  Attributes:
    cpu_s: CPU seconds (RLIMIT_CPU, rounded up to whole seconds).
    wall_s: wall-clock seconds, interpreter start-up included.
    memory_bytes: address space (RLIMIT_AS); the interpreter itself needs ~30 MB.
    file_bytes: the largest file the program may write (RLIMIT_FSIZE), stdout and stderr
      included (they are files outside the scratch directory).
    max_output_chars: characters of stdout and of stderr returned.
    max_processes: RLIMIT_NPROC (the user's processes; not applied to root).
    max_open_files: RLIMIT_NOFILE.
  """
  cpu_s: float = 2.0
  wall_s: float = 10.0
  memory_bytes: int = 512 * 2**20
  file_bytes: int = 2**20
  max_output_chars: int = 4096
  max_processes: int = 1
  max_open_files: int = 64

  def __post_init__(self):
    for name in ("cpu_s", "wall_s"):
      v = getattr(self, name)
      if not v > 0:
        raise ValueError(f"SandboxLimits.{name} must be > 0, got {v}")
    for name, low in (("memory_bytes", 64 * 2**20), ("file_bytes", 1), ("max_output_chars", 1),
                      ("max_processes", 1), ("max_open_files", 16)):
      v = getattr(self, name)
      if v < low:
        raise ValueError(f"SandboxLimits.{name} must be >= {low}, got {v}")


class SandboxResult(NamedTuple):
  """What one run gave (module docstring).

  Attributes:
    status: one of `STATUSES`.
    returncode: the exit code (negative: the signal that ended it; None: killed at the wall
      time).
    stdout, stderr: the decoded output, each cut to `max_output_chars`.
    detail: one line saying why a run failed ("" when ok).
    seconds: wall time of the call.
    truncated: stdout or stderr was cut.
  """
  status: str
  returncode: int | None
  stdout: str
  stderr: str
  detail: str
  seconds: float
  truncated: bool

  @property
  def ok(self) -> bool:
    return self.status == "ok"


# The boot code, run by the sandboxed interpreter before the program (sys.argv[1]: its config
# as JSON). Everything it defines is deleted before the program runs; the hook's state is in
# the closure of a function that nothing else references.
_BOOT = r'''
def _boot():
  import json, os, resource, sys
  cfg = json.loads(sys.argv[1])
  for name, soft, hard in cfg["rlimits"]:
    resource.setrlimit(getattr(resource, name), (soft, hard))
  real = os.path.realpath
  scratch = real(os.getcwd())
  roots = tuple(sorted({real(p) for p in sys.path if p}))
  dev_read = ("/dev/null", "/dev/urandom", "/dev/zero")
  write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
  spawn = frozenset(("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
                     "os.system", "os.startfile", "subprocess.Popen", "pty.spawn",
                     "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen",
                     "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "gc.get_objects",
                     "gc.get_referrers", "gc.get_referents", "os.setuid", "os.setgid",
                     "os.chroot", "mmap.__new__"))
  banned_modules = frozenset(("ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters",
                              "_xxinterpchannels"))
  # event -> (how many leading arguments are paths, positions of dir_fd arguments)
  modify = {"os.remove": (1, (1,)), "os.rmdir": (1, (1,)), "os.mkdir": (1, (2,)),
            "os.rename": (2, (2, 3)), "os.link": (2, (2, 3)), "os.symlink": (2, (2,)),
            "os.chmod": (1, (2,)), "os.chown": (1, (3,)), "os.utime": (1, (3,)),
            "os.truncate": (1, ()), "os.mkfifo": (1, (2,)), "os.mknod": (1, (3,)),
            "os.chflags": (1, ()), "os.lchflags": (1, ()), "os.chdir": (1, ()),
            "shutil.rmtree": (1, (1,)), "shutil.move": (2, ())}
  listing = frozenset(("os.listdir", "os.scandir", "glob.glob", "os.walk", "os.fwalk"))
  write, exit_, readlink = os.write, os._exit, os.readlink
  AT_FDCWD = -100

  def stop(what):
    try:
      write(2, ("\nsandbox: blocked " + what + "\n").encode("utf-8", "replace"))
    finally:
      exit_(cfg["blocked_exit"])

  def path_of(p):
    if isinstance(p, bytes):
      p = p.decode("utf-8", "surrogateescape")
    return real(os.fspath(p))

  def fd_path(fd):
    try:
      return real(readlink("/proc/self/fd/" + str(int(fd))))
    except (OSError, ValueError):
      return None

  def inside(p, dirs):
    return any(p == d or p.startswith(d.rstrip("/") + "/") for d in dirs)

  def hook(event, args):
    if event in spawn:
      stop(event)
    elif event.startswith("socket."):
      stop(event + " (no network)")
    elif event == "import" and args[0] in banned_modules:
      stop("import " + str(args[0]))
    elif event == "open":
      if isinstance(args[0], int):  # an open descriptor: its path was checked when opened
        return
      path, flags = path_of(args[0]), args[2]
      writing = isinstance(flags, int) and flags & write_flags
      if writing and not (inside(path, (scratch,)) or path == "/dev/null"):
        stop("writing " + path + " (outside the scratch directory)")
      if not writing and not (inside(path, (scratch,) + roots) or path in dev_read):
        stop("reading " + path + " (outside the scratch directory and the standard library)")
    elif event in modify:
      n_paths, dir_fds = modify[event]
      base = None  # the directory of a dir_fd argument (shutil.rmtree, tempfile use them)
      for i in dir_fds:
        if i < len(args) and isinstance(args[i], int) and args[i] != AT_FDCWD:
          base = fd_path(args[i])
      for a in args[:n_paths]:
        if isinstance(a, int):
          path = fd_path(a)
        else:
          path = path_of(a if base is None else os.path.join(base, os.fsdecode(a)))
        if path is None or not inside(path, (scratch,)):
          stop(event + " " + str(path or a) + " (outside the scratch directory)")
    elif event in listing:
      p = args[0] if args else None
      if isinstance(p, int):
        return
      path = path_of("." if p is None else p)
      if not inside(path, (scratch,) + roots):
        stop(event + " " + path + " (outside the scratch directory and the standard library)")

  sys.addaudithook(hook)
  sys.argv = [cfg["program"]]
  sys.dont_write_bytecode = True
  with open(cfg["program"], "rb") as f:
    return compile(f.read(), cfg["program"], "exec")


_code = _boot()
del _boot
_globals = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
exec(_code, _globals)
'''


def _rlimits(limits: SandboxLimits) -> list[tuple[str, int, int]]:
  cpu = max(1, math.ceil(limits.cpu_s))
  return [("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", limits.memory_bytes, limits.memory_bytes),
          ("RLIMIT_FSIZE", limits.file_bytes, limits.file_bytes), ("RLIMIT_CORE", 0, 0),
          ("RLIMIT_NPROC", limits.max_processes, limits.max_processes),
          ("RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files)]


def _check_files(files: Mapping[str, str]) -> None:
  for name in files:
    if (not isinstance(name, str) or not name or os.path.isabs(name) or ".." in name.split("/")
        or name == _PROGRAM):
      raise ValueError(f"files: {name!r} must be a relative path inside the scratch directory "
                       f"without '..' (and not {_PROGRAM!r}); give a plain file name")


def _read_capped(path: str, chars: int) -> tuple[str, int, bool]:
  """(text cut to `chars` characters, size of the file in bytes, cut)."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(4 * chars + 4)  # at most 4 bytes per UTF-8 character
  text = raw.decode("utf-8", "replace")
  cut = len(text) > chars or len(raw) < size
  return text[:chars], size, cut


def _last_line(text: str) -> str:
  lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
  return lines[-1][:200] if lines else ""


def _classify(rc: int | None, timed_out: bool, err: str, out_size: int, err_size: int,
              limits: SandboxLimits) -> tuple[str, str]:
  last = _last_line(err)
  if timed_out:
    return "timeout", f"ran past the wall time of {limits.wall_s:g} s"
  if rc == BLOCKED_EXIT and last.startswith("sandbox: blocked"):
    return "blocked", last
  if rc in (-signal.SIGXCPU, -signal.SIGKILL):
    return "cpu_limit", f"used its {max(1, math.ceil(limits.cpu_s))} s of CPU time"
  if max(out_size, err_size) >= limits.file_bytes:
    return "output_limit", f"wrote more than {limits.file_bytes} bytes of output"
  if rc == 0:
    return "ok", ""
  if "MemoryError" in last:
    return "memory_limit", f"ran out of its {limits.memory_bytes // 2**20} MB of memory"
  if rc is not None and rc < 0:
    return "killed", f"ended by signal {signal.Signals(-rc).name}"
  return "error", last or f"exit code {rc}"


def run_python(program: str, *, stdin: str = "", limits: SandboxLimits = SandboxLimits(),
               files: Mapping[str, str] | None = None, python: str | None = None
               ) -> SandboxResult:
  """Runs `program` in a fresh sandboxed interpreter (module docstring); never raises on
  what the program does.

  Args:
    program: Python source, run as `main.py` in the scratch directory (its working directory).
    stdin: text given on its standard input.
    limits: the resource limits.
    files: more files to put in the scratch directory first, name -> text.
    python: the interpreter (default: this one, `sys.executable`).

  Returns:
    A `SandboxResult`.

  Raises:
    ValueError: a bad `files` name (the caller's mistake, not the program's).
  """
  files = dict(files or {})
  _check_files(files)
  t0 = time.perf_counter()
  base = tempfile.mkdtemp(prefix="credit-sandbox-")
  try:
    scratch = os.path.join(base, "scratch")
    os.mkdir(scratch, 0o700)
    for name, text in {_PROGRAM: program, **files}.items():
      path = os.path.join(scratch, name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    cfg = json.dumps({"rlimits": _rlimits(limits), "blocked_exit": BLOCKED_EXIT,
                      "program": _PROGRAM})
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8"}
    out_path, err_path = os.path.join(base, "stdout"), os.path.join(base, "stderr")
    timed_out = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      proc = subprocess.Popen(
          [python or sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOT, cfg],
          cwd=scratch, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
          start_new_session=True, close_fds=True)
      try:
        proc.communicate(stdin.encode("utf-8"), timeout=limits.wall_s)
      except subprocess.TimeoutExpired:
        timed_out = True
      finally:
        try:  # the whole session: nothing the program started outlives the call
          os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
          pass
        proc.wait()
    rc = None if timed_out else proc.returncode
    stdout, out_size, cut_out = _read_capped(out_path, limits.max_output_chars)
    stderr, err_size, cut_err = _read_capped(err_path, limits.max_output_chars)
    status, detail = _classify(rc, timed_out, stderr, out_size, err_size, limits)
    return SandboxResult(status, rc, stdout, stderr, detail, time.perf_counter() - t0,
                         cut_out or cut_err)
  finally:
    shutil.rmtree(base, ignore_errors=True)
