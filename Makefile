# One command sets up a fresh machine and runs what you asked for.
#   make test   - create .venv, install credit[all], run the whole test suite
#   make run    - create .venv, install, train the default recipe (GRPO on arithmetic)
#   make control - the same wall time spent on supervised warm-up only (README table)
#   make docs    - build the documentation site into docs/_build/html (warnings are errors)
#   SEED=1 make run  - another seed (WORKDIR defaults to runs/default, runs/default_sft_only)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat setup.py | md5sum | cut -c1-8)
WORKDIR ?= runs/default
SEED ?= 0
TEST_WORKERS ?= 2

.PHONY: test run control bench setup docs

$(STAMP): setup.py
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[all]"
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q tests notebooks --nbmake -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --timeout=900 --nbmake-timeout=900

run: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m experiments.run --config experiments/configs/grpo_arithmetic.py --workdir $(WORKDIR) --config.seed=$(SEED)

control: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m experiments.run --config experiments/configs/grpo_arithmetic.py:sft_only --workdir $(WORKDIR)_sft_only --config.seed=$(SEED)

bench: $(STAMP)
	$(BIN)/python benchmarks/estimators.py

docs: $(STAMP)
	HF_HUB_OFFLINE=1 JAX_PLATFORMS=cpu $(BIN)/python -m sphinx -b html -W --keep-going -q docs docs/_build/html
