"""Test-wide JAX settings: 8 fake CPU devices, strict rank promotion, float32."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402

# Must happen before any JAX backend is initialised.
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")

import hypothesis  # noqa: E402

hypothesis.settings.register_profile(
    "credit", deadline=None, max_examples=25, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("credit")
