"""Another distro's kernel for the real-kernel tier: Debian trixie's 6.12 (gcc-14, glibc 2.38
kbuild tools) and its NVIDIA 550.163.01 open sources, fetched from trixie (never installed),
and the package `package build --build-root auto --patch` compiles from them, cached."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from . import assets
from .apt import AssetError, cache_root, log, trixie_apt
from .assets import Kernel, ensure_debs, locked, staging

REPO = Path(__file__).resolve().parents[2]
NVIDIA_VERSION = "550.163.01"
PATCH = REPO / "patches" / f"nvidia-{NVIDIA_VERSION}-pci-resize-resource.patch"


def release() -> str:
    """The release trixie's linux-image-amd64 points at (or GNI_TEST_TRIXIE_KERNEL_RELEASE)."""
    return assets.linked_release(trixie_apt(), "GNI_TEST_TRIXIE_KERNEL_RELEASE")


def kernel() -> Kernel:
    """trixie's kernel image and modules (.ko.xz), extracted and depmod'ed, cached."""
    return assets.ensure_kernel(release(), trixie_apt())


def headers_debs(k: Kernel) -> list[Path]:
    """linux-headers-<release>, -common and linux-kbuild-<abi> .debs from trixie."""
    return assets.headers_debs(k, trixie_apt())


def open_source_deb() -> Path:
    """trixie's nvidia-open-kernel-source 550.163.01 (contrib) .deb."""
    a = trixie_apt()
    matching = [v for v in a.versions("nvidia-open-kernel-source")
                if v.startswith(NVIDIA_VERSION)]
    if not matching:
        raise AssetError(f"no nvidia-open-kernel-source {NVIDIA_VERSION} in trixie's contrib")
    return ensure_debs(f"nvidia-open-kernel-source-{matching[0]}",
                       [f"nvidia-open-kernel-source={matching[0]}"], a)[0]


def build_roots() -> Path:
    """Where the product's `--build-root auto` keeps its roots for the tier (shared cache)."""
    return cache_root() / "build-roots"


def cli_build(source: Path, headers: list[Path], out: Path, *extra: str,
              timeout: float = 1500) -> tuple[int, str]:
    """`gpu-node-installer package build` in a subprocess: (exit code, stderr)."""
    cmd = [sys.executable, "-m", "installer", "package", "build", f"--nvidia-source={source}",
           *(f"--kernel-headers={h}" for h in headers), f"--out-dir={out}",
           f"--build-root-cache={build_roots()}", "--output=json", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          env=assets.build_env(), cwd=REPO)
    return done.returncode, done.stderr


def build_open_package(k: Kernel) -> Path:
    """The package of the open 550.163.01 modules compiled for trixie's kernel by the product
    (`--build-root auto --patch ...`), cached by the inputs' and the compile code's digests.
    Returns the package directory; `seconds` and `build.log` lie next to it."""
    source = open_source_deb()
    headers = headers_debs(k)
    out = k.root / f"nvidia-open-{NVIDIA_VERSION}-{assets.build_key([source, *headers, PATCH])}"
    with locked(f"nvidia-open-{k.release}"):
        if out.is_dir():
            return out / "pkg"
        log(f"compiling NVIDIA {source.name} for {k.release} in a trixie root (minutes)")
        with staging(out) as tmp:
            started = time.monotonic()
            rc, stderr = cli_build(source, headers, tmp / "pkg", "--build-root=auto",
                                   f"--patch={PATCH}", "--jobs=2", assets.compile_cache())
            if rc != 0:
                raise AssetError(f"package build exited {rc}:\n{stderr[-3000:]}")
            (tmp / "build.log").write_text(stderr)
            (tmp / "seconds").write_text(f"{time.monotonic() - started:.1f}\n")
    return out / "pkg"


def unpatched_build(k: Kernel) -> tuple[int, str, bool]:
    """`package build --build-root auto` of the open 550 sources without PATCH: (exit code,
    stderr, whether an out dir was left). The compile runs until nv-pci.c fails (a minute
    and more), so its outcome is kept like a package, keyed by the inputs and build code."""
    source = open_source_deb()
    headers = headers_debs(k)
    key = assets.build_key([source, *headers], b"--build-root=auto --jobs=2, no patch")
    out = k.root / f"nvidia-open-{NVIDIA_VERSION}-unpatched-{key}"
    with locked(f"nvidia-open-unpatched-{k.release}"):
        if not out.is_dir():
            log(f"compiling NVIDIA {source.name} for {k.release} without the patch (minutes)")
            with staging(out) as tmp:
                rc, stderr = cli_build(source, headers, tmp / "pkg", "--build-root=auto",
                                       "--jobs=2")
                (tmp / "outcome.json").write_text(json.dumps(
                    {"rc": rc, "stderr": stderr, "left": (tmp / "pkg").exists()}))
    outcome = json.loads((out / "outcome.json").read_text())
    return outcome["rc"], outcome["stderr"], outcome["left"]


def trixie_source_debs(version: str = NVIDIA_VERSION) -> dict[str, Path]:
    """Trixie's nvidia-kernel-source (non-free, proprietary) and nvidia-open-kernel-source
    (contrib, open) .debs of one version: Debian splits one version's sources in two."""
    a = trixie_apt()
    out = {}
    for name in ("nvidia-kernel-source", "nvidia-open-kernel-source"):
        matching = [v for v in a.versions(name) if v.startswith(version)]
        if not matching:
            raise AssetError(f"no {name} {version} in Debian trixie")
        out[name] = ensure_debs(f"{name}-{matching[0]}", [f"{name}={matching[0]}"], a)[0]
    return out
