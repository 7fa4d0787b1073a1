#!/usr/bin/env bash
# Install the Debian packages the test tiers need. Idempotent: does nothing when all are present.
# Each tier adds its packages to PACKAGES below.
set -euo pipefail

PACKAGES=(
  gcc make binutils
  util-linux mount         # verify tier: unshare -m + tmpfs /dev for NVIDIA's real libraries
  openssl curl             # fetch tier: self-signed TLS mirror; fetch benchmark compares with curl
  qemu-system-x86 kmod libelf1 gcc-12 xz-utils   # kernel tier: TCG guest, depmod, kbuild objtool, headers' gcc
  qemu-system-arm libc6-dev-arm64-cross   # kernel tier: the arm64 guest (qemu-system-aarch64 -M virt boots -kernel: no firmware) and its cross-built NVML stand-in
  makeself                 # package build: tests make a real makeself .run
  podman runc mmdebstrap   # deploy tier: image build from a local bookworm rootfs; kernel tier: package build --build-root auto
  gpg gpgv debian-archive-keyring   # package build --kernel-headers-from-apt: a signed test archive, its check
  rpm rpm2cpio createrepo-c   # package build: kernel-devel RPMs (rpmbuild), read by rpm2archive; a dnf repository (createrepo_c)
  prometheus               # metrics tier: a real Prometheus scrapes the agent; promtool checks its output
  qemu-user-static binfmt-support arch-test   # image tier: the arm64 base (mmdebstrap) and running the arm64 image
  gcc-aarch64-linux-gnu    # kernel tier: package build cross-compiles arm64 modules (bookworm: gcc-12)
  docker-registry          # image tier: `make push` to a real registry (the test starts its own)
)

# The Container Device Interface project's JSON schema (tests/host/test_cdi.py validates our
# spec with it). Debian ships it in the Go source package, whose dependencies would pull in
# a Go tree and a systemd upgrade: only that package is downloaded and its schema/ extracted.
CDI_SCHEMA_DIR=${GNI_CDI_SCHEMA_DIR:-/usr/local/share/gpu-node-installer-test/cdi-schema}
CDI_DEB=golang-github-container-orchestrated-devices-container-device-interface-dev
if [ ! -f "$CDI_SCHEMA_DIR/schema.json" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: the CDI schema is missing; run as root: sudo bash $0" >&2
    exit 1
  fi
  work=$(mktemp -d)
  (cd "$work" && { apt-get download -q "$CDI_DEB" >/dev/null 2>&1 \
     || { apt-get update -qq && apt-get download -q "$CDI_DEB" >/dev/null; }; } \
   && dpkg-deb -x ./*.deb x)
  mkdir -p "$CDI_SCHEMA_DIR"
  cp "$work"/x/usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface/schema/*.json "$CDI_SCHEMA_DIR/"
  rm -rf "$work"
  echo "install-deps: CDI schema from $CDI_DEB in $CDI_SCHEMA_DIR"
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${missing[*]}; run as root: sudo bash $0" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: installed ${missing[*]}"
  # docker-registry's package enables a registry on every address's port 5000 where systemd
  # runs; the tests start their own on 127.0.0.1 with a temp config, so that one is stopped.
  if [[ " ${missing[*]} " == *" docker-registry "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
  fi
fi

# qemu-user-static's binfmt handlers (arm64 code on an x86_64 machine, for the image tier) are
# registered by binfmt-support's service at boot; a machine without systemd (a CI container,
# a VM started without init) never runs it, so enable them here: the machine's setup, once.
# The tests only use handlers that are there (tests/deploy/podman.py says why when they are not).
BINFMT=/proc/sys/fs/binfmt_misc
if [ "$(uname -m)" = x86_64 ] && [ ! -e "$BINFMT/qemu-aarch64" ] && [ "$(id -u)" -eq 0 ]; then
  mountpoint -q "$BINFMT" || mount -t binfmt_misc binfmt_misc "$BINFMT" \
    || echo "install-deps: cannot mount $BINFMT; the image tier skips arm64" >&2
  if [ -e "$BINFMT/register" ] && update-binfmts --enable qemu-aarch64; then
    echo "install-deps: enabled binfmt handler qemu-aarch64"
  fi
fi
