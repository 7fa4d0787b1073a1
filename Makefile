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
.PHONY: image manifests lock push sbom
IMAGE_VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' installer/__init__.py)
# IMAGE_TARGET=build: the build image (compiler and make; the build farm's shards run it).
IMAGE_TARGET ?=
IMAGE ?= ghcr.io/gpu-node-installer/gpu-node-installer:$(IMAGE_VERSION)$(if $(IMAGE_TARGET),-$(IMAGE_TARGET))
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

image: ## build the container image with podman or docker (BASE_IMAGE=, PRELOADED_DIR=, IMAGE=, PLATFORMS=, IMAGE_TARGET=)
	@test -n "$(CONTAINER_ENGINE)" || { echo "make image: needs podman or docker" >&2; exit 1; }
	$(if $(and $(PLATFORMS),$(findstring podman,$(CONTAINER_ENGINE))),\
		$(CONTAINER_ENGINE) manifest exists $(IMAGE) && $(CONTAINER_ENGINE) manifest rm $(IMAGE) >/dev/null; true)
	$(CONTAINER_ENGINE) $(IMAGE_BUILD) $(IMAGE_BUILD_FLAGS) \
		$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
		$(if $(findstring podman,$(CONTAINER_ENGINE)),--build-arg BUILDPLATFORM=$(BUILD_PLATFORM)) \
		--build-arg VERSION=$(IMAGE_VERSION) --build-arg PRELOADED_DIR=$(PRELOADED_DIR) \
		$(if $(IMAGE_TARGET),--target $(IMAGE_TARGET)) \
		$(if $(PIP_CA),--secret id=pip-ca$(comma)src=$(PIP_CA)) $(IMAGE_OUTPUT) .

manifests: venv ## render every kustomize overlay and the examples into build/manifests/
	@mkdir -p $(MANIFESTS_DIR)
	@for dir in daemonset/overlays/*/ daemonset/examples/; do \
		out=$(MANIFESTS_DIR)/$$(basename $$dir).yaml; \
		$(BIN)/kubectl kustomize $$dir > $$out || exit 1; echo "$$out"; \
	done


# Push $(IMAGE) to REGISTRY (host[:port]/path) under its own name and tag, print the digest
# the registry stored, and pin it in OVERLAY, a kustomize overlay you keep outside daemonset/:
# OVERLAY/image/ (rewritten by every push) holds the `images:` entry by digest and, with
# PULL_SECRET=NAME, the pods' imagePullSecrets; OVERLAY/kustomization.yaml is written once, on
# OVERLAY_BASE, and then yours. PUSH_FLAGS go to the engine's push (--tls-verify=false for a
# registry without TLS, --creds or --authfile). With PLATFORMS, podman pushes the whole list.
REGISTRY ?=
OVERLAY ?=
OVERLAY_BASE ?= daemonset/overlays/gke-cos
PULL_SECRET ?=
PUSH_FLAGS ?=
PUSH_DIGEST_FILE ?= build/push.digest
PUSH_IMAGE = $(REGISTRY)/$(notdir $(IMAGE))
PUSH_REPOSITORY = $(REGISTRY)/$(firstword $(subst :, ,$(notdir $(IMAGE))))
IS_PODMAN = $(findstring podman,$(CONTAINER_ENGINE))
push: ## push IMAGE to REGISTRY=host[:port]/path and pin its digest in OVERLAY=dir (PULL_SECRET=, PUSH_FLAGS=)
	@test -n "$(CONTAINER_ENGINE)" || { echo "make push: needs podman or docker" >&2; exit 1; }
	@test -n "$(REGISTRY)" || { echo "make push: set REGISTRY=host[:port]/path" >&2; exit 1; }
	@mkdir -p $(dir $(PUSH_DIGEST_FILE)) && rm -f $(PUSH_DIGEST_FILE)
ifneq ($(and $(PLATFORMS),$(IS_PODMAN)),)
	$(CONTAINER_ENGINE) manifest push --all $(PUSH_FLAGS) --digestfile $(PUSH_DIGEST_FILE) \
		$(IMAGE) docker://$(PUSH_IMAGE)
else
	$(CONTAINER_ENGINE) tag $(IMAGE) $(PUSH_IMAGE)
	$(if $(IS_PODMAN),$(CONTAINER_ENGINE) push $(PUSH_FLAGS) --digestfile $(PUSH_DIGEST_FILE) \
		$(PUSH_IMAGE),$(CONTAINER_ENGINE) push $(PUSH_FLAGS) $(PUSH_IMAGE) && \
		$(CONTAINER_ENGINE) inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' \
		$(PUSH_IMAGE) | sed -n 's|^$(PUSH_REPOSITORY)@||p' > $(PUSH_DIGEST_FILE))
endif
	@echo "pushed $(PUSH_REPOSITORY)@$$(cat $(PUSH_DIGEST_FILE))"
	@$(if $(OVERLAY),$(PY) scripts/pin-image.py --overlay $(OVERLAY) \
		--repository $(PUSH_REPOSITORY) --digest "$$(cat $(PUSH_DIGEST_FILE))" \
		--base $(OVERLAY_BASE) $(if $(PULL_SECRET),--pull-secret $(PULL_SECRET)),true)

# The image's SBOM (CycloneDX JSON of its Python environment, made by the build) copied out
# beside it, without running the image: SBOM_OUT, and its sha256 (what `status` shows).
SBOM_PATH := /opt/gpu-node-installer/sbom.cdx.json
SBOM_OUT ?= build/$(notdir $(subst :,-,$(IMAGE))).sbom.cdx.json
sbom: ## copy the image's SBOM out to SBOM_OUT (build/<image>.sbom.cdx.json)
	@test -n "$(CONTAINER_ENGINE)" || { echo "make sbom: needs podman or docker" >&2; exit 1; }
	@mkdir -p $(dir $(SBOM_OUT))
	@id=$$($(CONTAINER_ENGINE) create $(IMAGE)) && \
		{ $(CONTAINER_ENGINE) cp $$id:$(SBOM_PATH) $(SBOM_OUT); rc=$$?; \
		  $(CONTAINER_ENGINE) rm $$id >/dev/null; exit $$rc; }
	@sha256sum $(SBOM_OUT)

# The image's locks (requirements/, checked in; the Dockerfile installs in --require-hashes
# mode): every pin with the hashes of all its files, for Python 3.11 on any platform, so one
# lock serves amd64 and arm64 images. uv runs from a throwaway venv and trusts the system's CAs; relock after changing
# pyproject's dependencies (tests/unit/test_lock.py fails until then).
UV_VERSION ?= 0.13.8
LOCK_VENV ?= build/lock-venv
LOCK_INDEX ?= https://pypi.org/simple
UV_COMPILE = $(LOCK_VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 \
	--generate-hashes --system-certs --index-url $(LOCK_INDEX) --custom-compile-command "make lock"
lock: ## relock the image's dependencies with hashes (requirements/*.txt) with uv
	@test -x $(LOCK_VENV)/bin/uv || { $(PY) -m venv $(LOCK_VENV) \
		&& $(LOCK_VENV)/bin/pip install -q uv==$(UV_VERSION); }
	$(UV_COMPILE) -o requirements/runtime.txt pyproject.toml
	$(UV_COMPILE) -o requirements/sbom.txt requirements/sbom.in
