# gpu-node-installer: the commands a newcomer needs. `make help` lists them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SAMPLE ?= gke-cos-a100x8
SAMPLE_DIR := $(shell mktemp -u /tmp/gni-sample-XXXXXX)

.PHONY: help venv deps test test-fast test-kernel kernel-assets lint sample clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed ## create .venv with the package and its dev tools

deps: ## install the system packages the test tiers use (root; no-op when present)
	bash scripts/install-deps.sh

test: venv deps ## run every test tier (unit, CLI, host-tree, real kernel)
	$(BIN)/pytest

test-fast: venv ## unit, CLI and host-tree tests only (no guest kernel)
	$(BIN)/pytest -m 'not kernel'

test-kernel: venv deps ## real-kernel tier alone: Debian's kernel under qemu/TCG (~2 min warm)
	$(BIN)/pytest tests/kernel

kernel-assets: venv deps ## fetch/build the kernel tier's cache (kernel, headers, modules; ~6 min cold)
	$(BIN)/python -m tests.kernel.assets

lint: venv ## ruff and strict mypy
	$(BIN)/ruff check .
	$(BIN)/mypy

sample: venv ## run `detect` on a sample node shipped with the project (no GPU needed)
	$(BIN)/python -m installer.testing $(SAMPLE) $(SAMPLE_DIR) >/dev/null
	$(BIN)/gpu-node-installer detect --host-root $(SAMPLE_DIR) \
		--proc-root $(SAMPLE_DIR)/proc --sys-root $(SAMPLE_DIR)/sys --log-format console
	@rm -rf $(SAMPLE_DIR)

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
