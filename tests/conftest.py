"""Test-wide JAX settings: 8 fake CPU devices, strict rank promotion, float32."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One persistent compilation cache per test session, shared by the xdist workers (they inherit
# the controller's environment) and by the runner subprocesses the end-to-end tests start: the
# many runs of the same tiny models compile each program once. A fresh directory, so a session
# starts cold like CI; results never depend on it (the cache is keyed by the program).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import tempfile  # noqa: E402
  _run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of one run
  if _run:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                           f"credit-jax-cache-{_run}")
  else:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="credit-jax-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
# Tests run tiny arrays: compile time dominates, so XLA:CPU skips its expensive LLVM passes
# (~20% less wall time on the registry-wide tests). The runner subprocesses of the end-to-end
# tests inherit the flags (so runs that are compared compile alike).
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                      "--xla_llvm_disable_expensive_passes=true")

import jax  # noqa: E402

# Must happen before any JAX backend is initialised.
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")

import hypothesis  # noqa: E402

hypothesis.settings.register_profile(
    "credit", deadline=None, max_examples=25, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("credit")


# Every compiled XLA:CPU executable holds ~3 memory mappings until it is freed, and a test
# worker runs hundreds of files: past the kernel's vm.max_map_count (65530 here) the next
# compilation's mmap fails and XLA segfaults (seen in CI at 97% of the suite, in the worker's
# compile or its cache write). So a worker frees its compiled programs between test files
# once it holds many mappings, and within a file as a fallback.
import gc  # noqa: E402

import pytest  # noqa: E402

_MAPS_BETWEEN_FILES = 15000
_MAPS_WITHIN_FILE = 45000


def _num_mappings() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux
    return 0


def _free_compiled_programs(limit: int) -> None:
  if _num_mappings() > limit:
    jax.clear_caches()
    gc.collect()


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_between_files():
  yield
  _free_compiled_programs(_MAPS_BETWEEN_FILES)


_tests_run = [0]


@pytest.fixture(autouse=True)
def _free_compiled_programs_within_file():
  yield
  _tests_run[0] += 1
  if _tests_run[0] % 20 == 0:
    _free_compiled_programs(_MAPS_WITHIN_FILE)


# Test files run heaviest first, so the last files the xdist workers pick up (`--dist
# loadfile --no-loadscope-reorder`) are short and both workers finish together. Costs are
# seconds per file from a timed run (`python -m tests.file_costs <CREDIT_TEST_TIMES dir>`
# rewrites them); a file not listed yet counts as _NEW_FILE_COST.
_COSTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_costs.json")
_NEW_FILE_COST = 10.0


def pytest_collection_modifyitems(config, items):
  del config
  import json  # pylint: disable=g-import-not-at-top
  with open(_COSTS_FILE, encoding="utf-8") as f:
    costs = json.load(f)
  file_of = lambda item: item.nodeid.split("::")[0]
  first = {}
  for i, item in enumerate(items):
    first.setdefault(file_of(item), i)
  # Stable within a file: ties (and each file's own items) keep the collection order.
  items.sort(key=lambda it: (-costs.get(file_of(it), _NEW_FILE_COST), first[file_of(it)]))


# CREDIT_TEST_TIMES=<dir>: each worker appends "<seconds>\t<test id>" per test phase to a file
# there as it goes, so the suite's cost per file survives a run that does not finish.
_TIMES_DIR = os.environ.get("CREDIT_TEST_TIMES")


def pytest_runtest_logreport(report):
  if _TIMES_DIR:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.makedirs(_TIMES_DIR, exist_ok=True)
    with open(os.path.join(_TIMES_DIR, f"{worker}.tsv"), "a") as f:
      f.write(f"{report.duration:.3f}\t{report.when}\t{report.nodeid}\n")
