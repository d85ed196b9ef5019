"""Installable package for `credit`: credit assignment for RL of LLMs in JAX."""
from setuptools import find_packages, setup

# Versions measured to work together on Python 3.11 (see ../shared/ENV_NOTES.md).
CORE = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "numpy==2.4.6",
    "tensorflow-datasets==4.9.10",
    "array_record==0.8.6",
    "importlib_resources",  # tfds needs it on Python 3.11 but does not declare it.
    "grain==0.2.18",
    "ml_collections==1.1.0",
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    "tqdm",
    "matplotlib",
    "math-verify==0.9.0",
    "jinja2",  # chat templates of HF tokenizers
    # BM25 for the search tool (credit/envs/search.py): maintained, pure Python on numpy,
    # sparse precomputed scores (fast queries), offline (nothing downloaded).
    "bm25s==0.3.16",
]
TEST = [
    "pytest==9.2.*",
    "hypothesis",
    "nbmake==1.5.5",
    "ipykernel",
    "pytest-xdist==3.8.*",  # make test: one worker per core, each test file on one worker
    "pytest-timeout==2.4.*",  # make test: a hung test fails after --timeout instead of eating CI
    "tensorboardX==2.6.*",  # decodes the runner's TensorBoard event files (its protobufs)
]
# The documentation site (make docs): Sphinx with MyST Markdown and MyST-NB for the notebooks.
DOCS = [
    "sphinx==9.0.4",
    "myst-parser==5.2.0",
    "myst-nb==1.4.0",
    "furo==2025.12.19",
]
# PyTorch + transformers are only the reference implementation in tests and benchmarks.
# torch is pinned exactly: a CPU wheel of 2.13.0 lies on disk; anything else pulls CUDA.
REFERENCE = [
    "torch==2.13.0",
    "transformers==5.23.0",
]

setup(
    name="credit",
    version="0.1.0",
    description="JAX-native credit assignment for reinforcement learning of LLMs.",
    packages=find_packages(include=["credit", "credit.*", "experiments", "experiments.*"]),
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require={"test": TEST, "reference": REFERENCE, "docs": DOCS,
                    "all": TEST + REFERENCE + DOCS},
)
