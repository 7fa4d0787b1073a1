#!/usr/bin/env bash
# Install the Debian packages the test tiers need. Idempotent: does nothing when all are present.
# Each tier adds its packages to PACKAGES below.
set -euo pipefail

PACKAGES=(
  gcc make binutils
  util-linux mount         # verify tier: unshare -m + tmpfs /dev for NVIDIA's real libraries
  openssl curl             # fetch tier: self-signed TLS mirror; fetch benchmark compares with curl
  qemu-system-x86 kmod libelf1 gcc-12 xz-utils   # kernel tier: TCG guest, depmod, kbuild objtool, headers' gcc
  makeself                 # package build: tests make a real makeself .run
  podman runc mmdebstrap   # deploy tier: image build from a local bookworm rootfs; kernel tier: package build --build-root auto
  prometheus               # metrics tier: a real Prometheus scrapes the agent; promtool checks its output
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${missing[*]}; run as root: sudo bash $0" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: installed ${missing[*]}"
