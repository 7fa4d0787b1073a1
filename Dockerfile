# syntax=docker/dockerfile:1
# gpu-node-installer: the image the DaemonSet runs (see docs/deploy.md).
#
# Build arguments:
#   BASE_IMAGE     a Debian-like image with python3 (>= 3.11) and its venv module. The default
#                  is the official slim Python image; where no registry is reachable, import a
#                  local root filesystem (tests/deploy does: mmdebstrap + `podman import`).
#   PIP_INDEX_URL  the index the builder stage takes wheels from (a mirror for private networks).
#   PRELOADED_DIR  a directory in the build context holding a driver repository (index.json and
#                  packages) to bake into the image for air-gapped nodes; empty by default.
#   VERSION        the installer version being packaged (the Makefile passes the package's).
#
# Targets: the default (last) stage is the small runtime image. `--target build` adds the
# compiler and make for BUILD_FALLBACK=auto (modules built on the node from a source package);
# its gcc must be the one the node's kernel was built with (gcc-12 for Debian bookworm).
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm

# --- builder: wheels for the installer and every dependency, from PyPI or a mirror
#     (PIP_INDEX_URL); a private CA for that index comes in as the build secret `pip-ca`:
#     podman build --secret id=pip-ca,src=/path/to/ca.crt ...
FROM ${BASE_IMAGE} AS builder
ARG PIP_INDEX_URL=https://pypi.org/simple
WORKDIR /src
COPY pyproject.toml README.md ./
COPY installer ./installer
RUN --mount=type=secret,id=pip-ca,required=false \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python3 -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-cache-dir --disable-pip-version-check \
       --index-url "${PIP_INDEX_URL}" --wheel-dir /wheels . \
    && sha256sum /wheels/*.whl > /wheels.sha256

# --- runtime: the wheels installed into a venv; no source tree, no compiler, no pip
FROM ${BASE_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG PRELOADED_DIR=daemonset/preloaded
LABEL org.opencontainers.image.title="gpu-node-installer" \
      org.opencontainers.image.description="Installs a matching NVIDIA kernel module and user-mode driver on a Kubernetes GPU node" \
      org.opencontainers.image.source="https://github.com/gpu-node-installer/gpu-node-installer" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Tools: modules load through finit_module(2) and NVML/CUDA through the staged libraries (both
# ctypes), downloads are Python (requests, certifi's CA bundle). The only program the installer
# runs is coreutils' `chroot`, to run the node's own ldconfig (every Debian-like base has
# coreutils); the pod's main container is the installer's own `agent` command, which runs the
# driver's daemons from the install dir (they come with the driver package, not the image).
# The wheels' digests, copied first: a COPY is cached by content, a RUN's bind mount is not,
# so without this a changed installer would reuse the venv layer of an older build.
COPY --from=builder /wheels.sha256 /var/lib/gpu-node-installer/wheels.sha256
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python3 -m venv /opt/gpu-node-installer \
    && /opt/gpu-node-installer/bin/pip install --no-cache-dir --disable-pip-version-check \
       --no-index --find-links /wheels "gpu-node-installer==${VERSION}" \
    && /opt/gpu-node-installer/bin/pip uninstall --yes --quiet pip setuptools \
    && ln -s /opt/gpu-node-installer/bin/gpu-node-installer /usr/local/bin/gpu-node-installer
COPY ${PRELOADED_DIR}/ /var/lib/gpu-node-installer/preloaded/
ENV DRIVER_PRELOADED_DIR=/var/lib/gpu-node-installer/preloaded \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["gpu-node-installer"]
CMD ["install"]

# --- build: the runtime plus what compiling NVIDIA's modules against a node's headers needs
#     (`--target build`); on-node builds are then on unless the DaemonSet says otherwise.
#     gpgv and Debian's keyring check `package build --kernel-headers-from-apt` (build farm).
FROM runtime AS build
ARG KERNEL_CC=gcc-12
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends "${KERNEL_CC}" make libc6-dev libelf-dev \
       xz-utils gpgv debian-archive-keyring \
    && rm -rf /var/lib/apt/lists/*
ENV BUILD_FALLBACK=auto

# --- the default target: the small runtime image, unchanged
FROM runtime
