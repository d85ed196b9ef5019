"""glibc malloc tuning shared by the benchmarks (import before jax).

XLA:CPU allocates every large temporary with malloc; with glibc's defaults each one above the
mmap threshold is a fresh mapping, so every call pays page faults on it and timings of
implementations with large temporaries are inflated 2-3x. `tune_malloc()` keeps freed blocks in
the heap instead (one arena, no mmap, no trimming), which is what a long-running training
process sees after warm-up. Scripts skip it under `--system-malloc`.
"""
from __future__ import annotations

import ctypes
import sys


def tune_malloc() -> bool:
  """Keeps freed blocks in the heap (no mmap/munmap per call). glibc only; False elsewhere."""
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return False
  m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8
  return (bool(libc.mallopt(m_arena_max, 1)) and bool(libc.mallopt(m_mmap_max, 0))
          and bool(libc.mallopt(m_trim_threshold, 2**30)))


def tune_unless_asked_not_to(is_main: bool) -> bool:
  """`tune_malloc()` for a script run as __main__ without --system-malloc."""
  return is_main and "--system-malloc" not in sys.argv and tune_malloc()
