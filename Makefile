# gpu-node-installer: the commands a newcomer needs. `make help` lists them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SAMPLE ?= gke-cos-a100x8
SAMPLE_DIR := $(shell mktemp -u /tmp/gni-sample-XXXXXX)

.PHONY: help venv deps demo test test-fast test-kernel test-cost kernel-assets lint sample clean

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

# The real-kernel tier's assets are built in the background (tests/prefetch.py, its log in the
# test cache) while the other tiers run; a test that needs one waits for that one only.
# TEST_WORKERS pytest-xdist workers share the tests a file at a time (a file's module fixtures
# are made once, on its worker).
TEST_WORKERS ?= 2
test: venv deps ## run every test tier (unit, CLI, host-tree, real kernel)
	@$(BIN)/python tests/prefetch.py --start
	@$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
		$(BIN)/python tests/prefetch.py --stop; exit $$rc

test-fast: venv ## unit, CLI and host-tree tests only (no guest kernel)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m 'not kernel'

test-kernel: venv deps ## real-kernel tier alone: Debian's kernel under qemu/TCG (~2 min warm)
	$(BIN)/pytest tests/kernel

test-cost: venv deps ## every tier with per-test times; writes docs/testing.md's cost table (LABEL=warm)
	@$(BIN)/python tests/prefetch.py --start
	@$(BIN)/python scripts/test-cost.py --label $(or $(LABEL),warm); rc=$$?; \
		$(BIN)/python tests/prefetch.py --stop; exit $$rc

kernel-assets: venv deps ## fetch/build the kernel tier's cache (kernel, headers, modules; ~6 min cold)
	$(BIN)/python -m tests.kernel.assets

lint: venv ## ruff, strict mypy and the import contracts (docs/architecture.md)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

demo: venv deps ## the whole install on Debian's kernel under qemu, no GPU needed (~10 min the first time, 1-2 min after); ARCH=arm64: on its arm64 kernel
	$(BIN)/python scripts/demo.py $(if $(ARCH),--arch $(ARCH))

sample: venv ## run `detect` on a sample node shipped with the project (no GPU needed)
	$(BIN)/python -m installer.testing $(SAMPLE) $(SAMPLE_DIR) >/dev/null
	$(BIN)/gpu-node-installer detect --host-root $(SAMPLE_DIR) \
		--proc-root $(SAMPLE_DIR)/proc --sys-root $(SAMPLE_DIR)/sys --log-format console
	@rm -rf $(SAMPLE_DIR)

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# --- deploy: the container image and the rendered manifests; docs/deploy.md -------
.PHONY: image manifests
IMAGE_VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' installer/__init__.py)
IMAGE ?= ghcr.io/gpu-node-installer/gpu-node-installer:$(IMAGE_VERSION)
CONTAINER_ENGINE ?= $(shell command -v podman || command -v docker)
BASE_IMAGE ?=
PRELOADED_DIR ?= daemonset/preloaded
PIP_CA ?= $(PIP_CERT)
MANIFESTS_DIR ?= build/manifests
comma := ,
# podman runs RUN steps in a chroot (works where nested containers cannot); add
# `--network host` where the build's own network cannot reach the package index.
IMAGE_BUILD_FLAGS ?= $(if $(findstring podman,$(CONTAINER_ENGINE)),--isolation chroot)

# PLATFORMS=linux/amd64,linux/arm64: one multi-arch manifest list named $(IMAGE), rebuilt from
# scratch (podman: --manifest; docker: buildx, which keeps it only with --push in
# IMAGE_BUILD_FLAGS or the containerd image store). A foreign platform's base must exist for
# it; the build itself runs no step of the target's code (Dockerfile), so no emulation.
PLATFORMS ?=
# podman 4.3 (Debian bookworm) sets BUILDPLATFORM but does not expand it in `FROM --platform=`
# unless it is passed as a build argument; without it the builder stage would run emulated.
BUILD_PLATFORM ?= linux/$(subst aarch64,arm64,$(subst x86_64,amd64,$(shell uname -m)))
IMAGE_OUTPUT = $(if $(PLATFORMS),--platform $(PLATFORMS) \
	$(if $(findstring podman,$(CONTAINER_ENGINE)),--manifest,-t) $(IMAGE),-t $(IMAGE))
IMAGE_BUILD = $(if $(and $(PLATFORMS),$(findstring docker,$(CONTAINER_ENGINE))),buildx build,build)

image: ## build the container image with podman or docker (BASE_IMAGE=, PRELOADED_DIR=, IMAGE=, PLATFORMS=)
	@test -n "$(CONTAINER_ENGINE)" || { echo "make image: needs podman or docker" >&2; exit 1; }
	$(if $(and $(PLATFORMS),$(findstring podman,$(CONTAINER_ENGINE))),\
		$(CONTAINER_ENGINE) manifest exists $(IMAGE) && $(CONTAINER_ENGINE) manifest rm $(IMAGE) >/dev/null; true)
	$(CONTAINER_ENGINE) $(IMAGE_BUILD) $(IMAGE_BUILD_FLAGS) \
		$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
		$(if $(findstring podman,$(CONTAINER_ENGINE)),--build-arg BUILDPLATFORM=$(BUILD_PLATFORM)) \
		--build-arg VERSION=$(IMAGE_VERSION) --build-arg PRELOADED_DIR=$(PRELOADED_DIR) \
		$(if $(PIP_CA),--secret id=pip-ca$(comma)src=$(PIP_CA)) $(IMAGE_OUTPUT) .

manifests: venv ## render every kustomize overlay and the examples into build/manifests/
	@mkdir -p $(MANIFESTS_DIR)
	@for dir in daemonset/overlays/*/ daemonset/examples/; do \
		out=$(MANIFESTS_DIR)/$$(basename $$dir).yaml; \
		$(BIN)/kubectl kustomize $$dir > $$out || exit 1; echo "$$out"; \
	done
