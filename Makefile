# Two commands set everything up on a fresh machine: `make test` and `make demo`.
# torch==2.13.0 is installed first: it is the CPU build this machine holds on disk; any other
# torch request would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test lint demo setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests $(wildcard benchmarks)
	$(BIN)/ruff format --check src tests $(wildcard benchmarks)
	$(BIN)/mypy src/proxrl/core

test: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/proxrl demo --output-dir runs/demo

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
