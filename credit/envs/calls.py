"""Host calls run concurrently, each with a time limit and its failures kept to itself.

The multi-turn engine steps the B environments of a turn through `call_all`: up to
`max_workers` calls at a time, each allowed `timeout_s` seconds from the moment it starts
(not from when it was queued). A call that raises, or runs past its time, gives a `Call`
with the error instead of its value; the other calls are not affected. Results come back in
the order of the calls, whatever order they finish in, so a rollout does not depend on
thread timing.

Calls run on daemon threads: a call that never returns is abandoned (its thread is left to
finish on its own and a new worker takes its place), and it cannot keep the process from
exiting. A Python thread cannot be stopped from outside, so an abandoned call may still
change the object it was called on; the engine therefore never calls that object again.

With `max_workers=1` and no time limit the calls run one after another on the calling
thread (for objects that must not be called from another thread, or in a set order).

>>> out = call_all([lambda: 1, lambda: 1 // 0], max_workers=2, timeout_s=1.0)
>>> out[0].value, out[1].error
(1, 'ZeroDivisionError: integer division or modulo by zero')
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

__all__ = ["Call", "call_all"]


class Call(NamedTuple):
  """The outcome of one call.

  Attributes:
    value: what the call returned (None when it failed).
    error: None on success, else "<ExceptionType>: <message>" or "timed out after <t> s".
    timed_out: the call ran past its time limit (and was abandoned).
    seconds: how long it ran (the time limit for a call that timed out).
  """
  value: Any
  error: str | None
  timed_out: bool
  seconds: float


def _describe(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}"


def _run_inline(fns: Sequence[Callable[[], Any]]) -> list[Call]:
  out = []
  for fn in fns:
    t0 = time.perf_counter()
    try:
      out.append(Call(fn(), None, False, time.perf_counter() - t0))
    except Exception as e:  # pylint: disable=broad-except  # isolation is the point
      out.append(Call(None, _describe(e), False, time.perf_counter() - t0))
  return out


def call_all(fns: Sequence[Callable[[], Any]], *, max_workers: int = 16,
             timeout_s: float | None = None) -> list[Call]:
  """Runs `fns` (no-argument callables) concurrently; returns one `Call` per fn, in order.

  Args:
    fns: the calls.
    max_workers: at most this many run at once (>= 1).
    timeout_s: seconds each call may run, counted from its start (None: no limit).

  Returns:
    `[Call]`, `out[i]` the outcome of `fns[i]`.
  """
  if max_workers < 1:
    raise ValueError(f"max_workers must be >= 1, got {max_workers}")
  if timeout_s is not None and not timeout_s > 0:
    raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
  n = len(fns)
  if n == 0:
    return []
  if timeout_s is None and (max_workers == 1 or n == 1):
    return _run_inline(fns)
  return _Batch(fns, max_workers, timeout_s).run()


class _Batch:
  """One `call_all`: a queue of call indices, worker threads, and the calls' deadlines."""

  def __init__(self, fns, max_workers: int, timeout_s: float | None):
    self.fns, self.timeout_s = fns, timeout_s
    self.results: list[Call | None] = [None] * len(fns)
    self.started: dict[int, float] = {}  # running calls: index -> start time
    self.next = 0
    self.left = len(fns)
    self.cond = threading.Condition()
    self.workers = min(max_workers, len(fns))

  def _spawn(self) -> None:
    threading.Thread(target=self._work, daemon=True, name="credit-env-call").start()

  def _work(self) -> None:
    while True:
      with self.cond:
        if self.next >= len(self.fns):
          return
        i = self.next
        self.next += 1
        t0 = time.perf_counter()
        self.started[i] = t0
        self.cond.notify_all()  # the waiter now knows this call's deadline
      try:
        res = Call(self.fns[i](), None, False, time.perf_counter() - t0)
      except Exception as e:  # pylint: disable=broad-except
        res = Call(None, _describe(e), False, time.perf_counter() - t0)
      with self.cond:
        if self.results[i] is not None:  # timed out meanwhile: a replacement took over
          return
        del self.started[i]
        self.results[i] = res
        self.left -= 1
        self.cond.notify_all()

  def run(self) -> list[Call]:
    for _ in range(self.workers):
      self._spawn()
    with self.cond:
      while self.left:
        if self.timeout_s is None or not self.started:
          self.cond.wait(timeout=None if self.timeout_s is None else self.timeout_s)
          continue
        now = time.perf_counter()
        first = min(self.started.values())
        if now - first < self.timeout_s:
          self.cond.wait(timeout=self.timeout_s - (now - first))
          continue
        for i, t0 in list(self.started.items()):
          if now - t0 >= self.timeout_s:
            del self.started[i]
            self.results[i] = Call(None, f"timed out after {self.timeout_s:g} s", True,
                                   self.timeout_s)
            self.left -= 1
            self._spawn()  # the stuck thread keeps running; another worker takes its place
    return list(self.results)
