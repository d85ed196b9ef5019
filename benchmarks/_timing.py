"""The timer the benchmark scripts share."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
  """(best, median) wall seconds of `fn()` over `repeats` calls after one warm-up call (the
  compile); each call's outputs are waited for."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return min(times), statistics.median(times)
