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

import jax  # noqa: E402

# Must happen before any JAX backend is initialised.
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")

import hypothesis  # noqa: E402

hypothesis.settings.register_profile(
    "credit", deadline=None, max_examples=25, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("credit")
