# One command sets up a fresh machine and runs what you asked for.
#   make test   - create .venv, install credit[all], run the whole test suite
#   make run    - create .venv, install, train the default recipe (GRPO on arithmetic)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat setup.py | md5sum | cut -c1-8)
WORKDIR ?= runs/default

.PHONY: test run bench setup

$(STAMP): setup.py
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[all]"
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q tests notebooks --nbmake -p no:cacheprovider

run: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m experiments.run --config experiments/configs/grpo_arithmetic.py --workdir $(WORKDIR)

bench: $(STAMP)
	$(BIN)/python benchmarks/estimators.py
