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

# --- base: the target platform's base, named first. podman 4.3 resolves a base image's name
#     once per build and the first stage to name it decides which platform's image every
#     later stage without its own --platform gets; were the builder first, an arm64 image would
#     be built on the amd64 base.
FROM ${BASE_IMAGE} AS base

# --- builder: runs on the build machine's own platform ($BUILDPLATFORM), also when it builds
#     the image for another one: it builds the installer's wheel (pure Python), downloads the
#     dependencies' wheels for the target platform ($TARGETARCH; compiled ones such as
#     cryptography, google-crc32c and pyyaml are per architecture), and installs them into the
#     venv the runtime stage copies. So no step of the default target runs the target's code:
#     an arm64 image builds on an x86_64 machine without emulation once its base exists
#     (podman 4.3 needs `--build-arg BUILDPLATFORM=linux/amd64` for that: `make image` passes it).
#     Every dependency is pinned with its hashes in requirements/runtime.txt (`make lock` writes
#     it) and pip installs in --require-hashes mode, so the same lock gives the same wheels.
#     Wheels come from PyPI or a mirror (PIP_INDEX_URL); a private CA for that index comes in
#     as the build secret `pip-ca`: podman build --secret id=pip-ca,src=/path/to/ca.crt ...
FROM --platform=${BUILDPLATFORM} ${BASE_IMAGE} AS builder
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TARGETARCH
ARG VERSION=0.1.0
WORKDIR /src
# Layer 1, rebuilt only when a lock changes: the dependencies' wheels for the target, and the
# SBOM tool (cyclonedx-bom, its own lock) in the builder's venv. The target's wheel tags are its
# machine name with every manylinux level up to the glibc of this (the same) base, so pip
# picks what the target's interpreter would; layer 2 reads them back.
COPY requirements/runtime.txt requirements/sbom.txt ./requirements/
RUN --mount=type=secret,id=pip-ca,required=false \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && case "${TARGETARCH}" in amd64) machine=x86_64 ;; arm64) machine=aarch64 ;; \
       *) echo "unsupported TARGETARCH ${TARGETARCH}: amd64 or arm64" >&2; exit 1 ;; esac \
    && glibc=$(python3 -c 'import os; print(os.confstr("CS_GNU_LIBC_VERSION").split()[1])') \
    && set -- --platform "manylinux2014_${machine}" && minor=17 \
    && while [ "${minor}" -le "${glibc#2.}" ]; do \
         set -- "$@" --platform "manylinux_2_${minor}_${machine}"; minor=$((minor + 1)); done \
    && printf '%s\n' "$@" > /platform-args \
    && python3 -m venv /opt/build \
    && /opt/build/bin/pip download --no-cache-dir --disable-pip-version-check \
       --index-url "${PIP_INDEX_URL}" --only-binary=:all: "$@" --require-hashes \
       --dest /wheels -r requirements/runtime.txt \
    && /opt/build/bin/pip install --no-cache-dir --disable-pip-version-check \
       --index-url "${PIP_INDEX_URL}" --only-binary=:all: --require-hashes \
       -r requirements/sbom.txt
# Layer 2, the installer: its wheel (hashed here, so the whole install stays in hash mode),
# and the venv made here at its final path (scripts' #! lines name it) without pip; `pip
# --python` installs with the venv's interpreter, `--target` because pip allows a foreign
# platform only there. The installer's own requirements must be met by the lock's pins (no
# index: a dependency missing from the lock fails here). The SBOM (CycloneDX JSON) then lists
# the distributions installed there: cyclonedx-py reads their metadata through the venv's
# interpreter, which is this stage's (the build platform's) python3, not the target's.
COPY pyproject.toml README.md ./
COPY installer ./installer
RUN --mount=type=secret,id=pip-ca,required=false \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && set -- && while read -r arg; do set -- "$@" "${arg}"; done < /platform-args \
    && /opt/build/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
       --index-url "${PIP_INDEX_URL}" --wheel-dir /self . \
    && for wheel in /self/gpu_node_installer-"${VERSION}"-*.whl; do \
         sum=$(sha256sum "${wheel}") && echo "${wheel} --hash=sha256:${sum%% *}"; done > /self.txt \
    && python3 -m venv --without-pip /opt/gpu-node-installer \
    && site=$(/opt/gpu-node-installer/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
    && /opt/build/bin/pip --python /opt/gpu-node-installer/bin/python install --no-cache-dir \
       --disable-pip-version-check --no-index --find-links /wheels --only-binary=:all: "$@" \
       --require-hashes --target "${site}" -r requirements/runtime.txt -r /self.txt \
    && mv "${site}"/bin/* /opt/gpu-node-installer/bin/ && rmdir "${site}/bin" \
    && /opt/build/bin/cyclonedx-py environment --output-reproducible --mc-type application \
       --output-file /opt/gpu-node-installer/sbom.cdx.json /opt/gpu-node-installer/bin/python \
    && mkdir -p /link/usr/local/bin \
    && ln -s /opt/gpu-node-installer/bin/gpu-node-installer /link/usr/local/bin/gpu-node-installer

# --- runtime: the builder's venv on the target's base; no source tree, no compiler, no pip,
#     and no RUN: nothing here executes the target platform's code
FROM base AS runtime
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
COPY --from=builder /opt/gpu-node-installer /opt/gpu-node-installer
COPY --from=builder /link/ /
COPY ${PRELOADED_DIR}/ /var/lib/gpu-node-installer/preloaded/
ENV DRIVER_PRELOADED_DIR=/var/lib/gpu-node-installer/preloaded \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["gpu-node-installer"]
CMD ["install"]

# --- build: the runtime plus what compiling NVIDIA's modules against a node's headers needs
#     (`--target build`); on-node builds are then on unless the DaemonSet says otherwise.
#     gpgv and Debian's keyring check `package build --kernel-headers-from-apt` (build farm);
#     rpm2cpio's rpm2archive reads kernel-devel RPMs (--kernel-headers-from-dnf, RHEL/AL2023).
FROM runtime AS build
ARG KERNEL_CC=gcc-12
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends "${KERNEL_CC}" make libc6-dev libelf-dev \
       xz-utils gpgv debian-archive-keyring rpm2cpio \
    && rm -rf /var/lib/apt/lists/*
ENV BUILD_FALLBACK=auto

# --- the default target: the small runtime image, unchanged
FROM runtime
