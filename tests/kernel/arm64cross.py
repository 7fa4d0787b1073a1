"""Bookworm's arm64 inputs for the cross-compile tier, downloaded (never installed) and cached.

A private apt index of Debian's arm64 archive (`APT::Architecture=arm64`, its own state dir
under the tier's cache) gives the arm64 headers (`linux-headers-<release>-arm64` and its
-common) and NVIDIA's arm64 module sources (their `nv-kernel.o_binary` is per arch). The
kbuild tools come from the host's (amd64) index: Debian's `linux-kbuild-X.Y` is
`Multi-Arch: foreign`, built to serve every target arch (its modpost picks a variant by the
module's ELF class and byte order), which is how Debian itself cross-builds modules.
"""

from __future__ import annotations

import re
from pathlib import Path

from .apt import Apt, AssetError, apt, cache_root
from .assets import NVIDIA_REAL_VERSION, ensure_debs

SOURCES = ("nvidia-kernel-source", "nvidia-open-kernel-source")


class Arm64Apt(Apt):
    """The machine's bookworm archives, indexed for arm64 only."""

    def options(self) -> list[str]:
        return [*super().options(), "-oAPT::Architecture=arm64",
                "-oAPT::Architectures::=arm64"]


def arm64_apt() -> Apt:
    root = cache_root() / "apt-arm64"
    root.mkdir(parents=True, exist_ok=True)
    return Arm64Apt(root)


def arm64_release() -> str:
    """The release bookworm's linux-headers-arm64 depends on now."""
    out = arm64_apt().query("depends", "linux-headers-arm64")
    found = re.search(r"Depends: linux-headers-(\d\S*-arm64)$", out, re.M)
    if not found:
        raise AssetError(f"cannot tell which headers linux-headers-arm64 depends on:\n{out}")
    return found[1]


def arm64_headers_debs(release: str) -> list[Path]:
    """linux-headers-<release> and its -common (arm64), plus the host's linux-kbuild."""
    index = arm64_apt()
    version = index.version(f"linux-headers-{release}")
    abi = release.rsplit("-", 1)[0]
    headers = ensure_debs(f"arm64-headers-{release}-{version}",
                          [f"linux-headers-{release}={version}",
                           f"linux-headers-{abi}-common={version}"], index)
    kbuild = "linux-kbuild-" + ".".join(release.split(".")[:2])
    host = apt()
    kversion = version if version in host.versions(kbuild) else host.version(kbuild)
    return [*headers, *ensure_debs(f"kbuild-{kbuild}-{kversion}-amd64",
                                   [f"{kbuild}={kversion}"])]


def arm64_source_deb(package: str) -> Path:
    """NVIDIA's arm64 module sources of the tier's pinned version (proprietary or open)."""
    index = arm64_apt()
    matching = [v for v in index.versions(package) if v.startswith(NVIDIA_REAL_VERSION)]
    if not matching:
        raise AssetError(f"no arm64 {package} {NVIDIA_REAL_VERSION} in Debian's non-free")
    return ensure_debs(f"arm64-{package}-{matching[0]}", [f"{package}={matching[0]}"],
                       index)[0]
