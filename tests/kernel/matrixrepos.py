"""The many-kernel and both-flavour repositories test_matrix_real.py checks, built once by
the real CLI from NVIDIA's real sources and cached (also built ahead by tests/prefetch.py).

Each is keyed by the inputs' and the build code's digests and the command's flags, like
`assets.build_nvidia_cli`; the compiles themselves are kept by the product's
`--compile-cache`, so the 535 proprietary compile for the tier's kernel (that package's) is
made once and reused by both repositories: each compiles only what no other test compiles.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from . import assets
from .arm64cross import OPEN_PCI_RESIZE_PATCH
from .assets import Kernel

REPO = Path(__file__).resolve().parents[2]
SECOND_RELEASE = "6.1.0-56-amd64"
OPEN_SOURCE = "nvidia-open-kernel-source"


def _unique(debs: list[Path]) -> list[Path]:
    """linux-kbuild-6.1 is shared by the releases: give it once."""
    seen: dict[str, Path] = {}
    for deb in debs:
        seen.setdefault(deb.name, deb)
    return list(seen.values())


def _repo(kernel: Kernel, name: str, args: list[str], inputs: list[Path]) -> Path:
    """Run `package build ... --repo` once per inputs and code (cached): the repository."""
    # the flags as given, but for the checkout's own path (a patch lives in it): every
    # clone shares the entry
    key = assets.build_key(inputs, " ".join(args).replace(str(REPO), "<repo>").encode())
    out = kernel.root / f"{name}-{key}"
    with assets.locked(f"{name}-{kernel.release}"):
        if out.is_dir():
            return out / "repo"
        with assets.staging(out) as tmp:
            started = time.monotonic()
            output = assets.run([sys.executable, "-m", "installer", "package", "build", *args,
                                 f"--repo={tmp / 'repo'}", "--output=json",
                                 assets.compile_cache()], env=assets.build_env())
            (tmp / "result.json").write_text(output)
            (tmp / "seconds").write_text(f"{time.monotonic() - started:.1f}\n")
    return out / "repo"


def two_kernels_repo(kernel: Kernel) -> Path:
    """bookworm's real 535 compiled for the tier's kernel and SECOND_RELEASE, one command."""
    source = assets.nvidia_source_deb()
    headers = _unique([*assets.headers_debs(kernel),
                       *assets.release_headers_debs(SECOND_RELEASE)])
    return _repo(kernel, "matrix-535", [f"--nvidia-source={source}", "--jobs=2",
                                        *(f"--kernel-headers={h}" for h in headers)],
                 [source, *headers])


def open_patch(kernel: Kernel) -> Path:
    """The tier's one-line fix the open 535 needs for bookworm's 6.1.0-57 (arm64cross says
    why), as a file `--patch` takes: one path per cache, so the repository's key is stable."""
    path = kernel.root / "open-535-pci-resize-resource.patch"
    if not path.is_file() or path.read_text() != OPEN_PCI_RESIZE_PATCH:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(OPEN_PCI_RESIZE_PATCH)
        tmp.rename(path)
    return path


def both_flavours_repo(kernel: Kernel) -> Path:
    """bookworm's real 535 sources, proprietary and open (patched), for the tier's kernel, one
    command (`--flavour both`): the proprietary compile is the compile cache's, the open new."""
    sources = [assets.nvidia_source_deb(), assets.nvidia_source_deb(OPEN_SOURCE)]
    headers = assets.headers_debs(kernel)
    patch = open_patch(kernel)
    return _repo(kernel, "matrix-535-both",
                 [*(f"--nvidia-source={s}" for s in sources), "--flavour=both",
                  f"--patch={patch}", "--jobs=2", *(f"--kernel-headers={h}" for h in headers)],
                 [*sources, *headers, patch])
