"""What the arm64 guest installs: Debian's arm64 NVIDIA 535 user-mode files (NVML and CUDA
swapped for the C stand-ins, cross-compiled), and NVIDIA's real nvidia.ko cross-built for
the guest's exact release (tests/kernel/arm64cross.py), all cached outside the repo."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .apt import AssetError, cache_root, log
from .arm64cross import arm64_apt, cross_package
from .assets import NVIDIA_REAL_VERSION, locked, staging

# The arm64 user-mode packages a node needs for `install` (nvvm/ptxjit add nothing here).
USER_PACKAGES = ("libcuda1", "libnvidia-ml1", "nvidia-smi")
LIB_DIR = "usr/lib/aarch64-linux-gnu/nvidia/current"
CROSS_CC = "aarch64-linux-gnu-gcc"  # Debian's gcc-aarch64-linux-gnu (+ libc6-dev-arm64-cross)


def user_tree() -> Path:
    """USER_PACKAGES of NVIDIA_REAL_VERSION for arm64, extracted with `dpkg-deb -x` (cached)."""
    index = arm64_apt()
    versions = [v for v in index.versions("libcuda1") if v.startswith(NVIDIA_REAL_VERSION)]
    if not versions:
        raise AssetError(f"no arm64 libcuda1 {NVIDIA_REAL_VERSION} in Debian's non-free")
    dest = cache_root() / "arm64-guest" / f"user-{versions[0]}"
    with locked(f"arm64-user-{versions[0]}"):
        if not dest.is_dir():
            log(f"fetching arm64 {', '.join(USER_PACKAGES)} {versions[0]}")
            with staging(dest) as tmp:
                (tmp / "debs").mkdir()
                index.download([f"{p}={versions[0]}" for p in USER_PACKAGES], tmp / "debs")
                for deb in sorted((tmp / "debs").glob("*.deb")):
                    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "tree")], check=True)
                shutil.rmtree(tmp / "debs")
    if not (dest / "tree" / LIB_DIR).is_dir():
        raise AssetError(f"{dest} has no {LIB_DIR}; delete it to refetch")
    return dest / "tree"


def real_nvidia_ko() -> Path:
    """NVIDIA's real 535 proprietary nvidia.ko, cross-built by `package build` for bookworm's
    arm64 release (minutes cold; arm64cross caches it keyed by its inputs)."""
    pkg = cross_package("proprietary") / "pkg"
    found = sorted(pkg.rglob("nvidia.ko"))
    if len(found) != 1:
        raise AssetError(f"{pkg} holds {len(found)} nvidia.ko; delete it to rebuild")
    return found[0]
