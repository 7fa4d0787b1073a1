"""Bookworm's arm64 inputs for the cross-compile tier, downloaded (never installed) and cached.

A private apt index of Debian's arm64 archive (`APT::Architecture=arm64`, its own state dir
under the tier's cache) gives the arm64 headers (`linux-headers-<release>-arm64` and its
-common) and NVIDIA's arm64 module sources (their `nv-kernel.o_binary` is per arch). The
kbuild tools come from the host's (amd64) index: Debian's `linux-kbuild-X.Y` is
`Multi-Arch: foreign`, built to serve every target arch (its modpost picks a variant by the
module's ELF class and byte order), which is how Debian itself cross-builds modules.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from arm64debs import arm64_apt

from .apt import AssetError, apt, cache_root, log, run
from .assets import (
    NVIDIA_REAL_VERSION,
    build_env,
    build_key,
    compile_cache,
    ensure_debs,
    locked,
    staging,
)

SOURCES = {"proprietary": "nvidia-kernel-source", "open": "nvidia-open-kernel-source"}
# bookworm's 6.1.0-57 backports pci_resize_resource's fourth argument (exclude_bars); the
# open 535.261.03 sources (the only ones bookworm has) still call it with three, and fail
# ("too few arguments to function 'pci_resize_resource'", nv-pci.c line 223) on amd64 too.
# The product's --patch is how a user fixes that; this is the tier's one-line fix.
OPEN_PCI_RESIZE_PATCH = """\
--- a/nvidia/nv-pci.c
+++ b/nvidia/nv-pci.c
@@ -220,7 +220,7 @@
\x20
 resize:
     /* Attempt to resize BAR1 to the largest supported size */
-    r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);
+    r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size, 0);
\x20
     if (r) {
         if (r == -ENOSPC)
"""


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


def cross_command(source: Path, headers: list[Path], out: Path, *extra: str) -> list[str]:
    """The product's CLI cross-compiling NVIDIA's arm64 sources on this (x86_64) machine."""
    return [sys.executable, "-m", "installer", "package", "build", f"--nvidia-source={source}",
            *(f"--kernel-headers={h}" for h in headers), "--arch=aarch64", f"--out-dir={out}",
            *extra]


def cross_package(flavour: str) -> Path:
    """NVIDIA's real 535 modules for bookworm's arm64 kernel, cross-compiled by `package
    build` (minutes cold), cached under `<cache>/arm64/<release>/` keyed by the inputs'
    digests and the product's build code (the compile itself kept by `--compile-cache`).
    Returns the build's dir: `pkg/` (the package), `seconds` (the build's time), the patch
    the open sources need for this kernel (OPEN_PCI_RESIZE_PATCH)."""
    release = arm64_release()
    source = arm64_source_deb(SOURCES[flavour])
    headers = arm64_headers_debs(release)
    fix = OPEN_PCI_RESIZE_PATCH.encode() if flavour == "open" else b""
    key = build_key([source, *headers], fix)
    out = cache_root() / "arm64" / release / f"nvidia-cli-{flavour}-{key}"
    with locked(f"arm64-{release}-{flavour}"):
        if out.is_dir():
            return out
        log(f"cross-compiling NVIDIA {source.name} ({flavour}) with package build (minutes)")
        with staging(out) as tmp:
            extra = [compile_cache()]
            if flavour == "open":
                (tmp / "open-pci-resize.patch").write_text(OPEN_PCI_RESIZE_PATCH)
                extra.append(f"--patch={tmp / 'open-pci-resize.patch'}")
            started = time.monotonic()
            output = run(cross_command(source, headers, tmp / "pkg", "--jobs=2", *extra),
                         env=build_env())
            (tmp / "build.log").write_text(output)
            (tmp / "seconds").write_text(f"{time.monotonic() - started:.1f}\n")
    return out


if __name__ == "__main__":  # PYTHONPATH=tests python -m tests.kernel.arm64cross
    for wanted in os.environ.get("GNI_ARM64_FLAVOURS", "open").split():
        print(cross_package(wanted) / "pkg")
