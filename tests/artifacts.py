"""Real NVIDIA 535 test artifacts from Debian's non-free archive, downloaded once and cached.

apt runs with a private configuration (the machine's bookworm archives widened to non-free,
its own lists and archive directories under the cache; see tests/kernel/assets.py), so the
machine's apt setup is never changed. Packages are only
downloaded and extracted with `dpkg-deb -x`, never installed.

    nvidia_debs()              -> {"libcuda1": Path(.deb), ...} for 535.261.03
    nvidia_tree()              -> the extracted tree (libraries in LIB_DIR)
    nvidia_debs("535.309.01")  -> the security update, a second real version for upgrade tests
    persistenced_deb()         -> Debian's nvidia-persistenced .deb (its own version, 535.171.04)
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_VERSION = "535.261.03"
DEBIAN_VERSIONS = {"535.261.03": "535.261.03-1", "535.309.01": "535.309.01-0+deb12u1"}
USER_PACKAGES = ("libcuda1", "libnvidia-ml1", "nvidia-smi", "libnvidia-ptxjitcompiler1",
                 "libnvidia-nvvm4")
SOURCE_PACKAGES = ("nvidia-kernel-source",)
LIB_DIR = "usr/lib/x86_64-linux-gnu/nvidia/current"
# Debian packages the persistence daemon apart from the driver, at its own version (contrib)
PERSISTENCED_VERSION = "535.171.04"
PERSISTENCED_DEBIAN_VERSION = "535.171.04-1~deb12u1"


def cache_root() -> Path:
    """Where big test artifacts live (outside the repo): the kernel tier's cache root."""
    from kernel.assets import cache_root as root

    path = root()
    path.mkdir(parents=True, exist_ok=True)
    return path


def makeself_run(staging: Path, target: Path, arch: str, version: str, installer: str) -> Path:
    """`staging` packed by Debian's makeself as NVIDIA's .run for `arch` at `target` (through
    a .partial file), with `installer` as its ./nvidia-installer (never run); the staging dir
    is removed."""
    (staging / "nvidia-installer").write_text(installer)
    (staging / "nvidia-installer").chmod(0o755)
    partial = target.with_name(target.name + ".partial")
    subprocess.run(["makeself", "--nox11", "--nocomp", "--quiet", str(staging), str(partial),
                    f"NVIDIA Accelerated Graphics Driver for Linux-{arch} {version}",
                    "./nvidia-installer"], check=True, stdout=subprocess.DEVNULL)
    partial.rename(target)
    shutil.rmtree(staging)
    return target


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise downloads between concurrent test processes."""
    with (cache_root() / f".{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _download(packages: tuple[str, ...], debian_version: str, dest: Path) -> None:
    """apt-get download through the kernel tier's private apt (the machine's archives)."""
    from kernel.assets import apt

    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    apt().download([f"{name}={debian_version}" for name in packages], tmp)
    tmp.rename(dest)


def nvidia_debs(version: str = DEFAULT_VERSION, *, with_source: bool = False
                ) -> dict[str, Path]:
    """The Debian .deb files of one NVIDIA version, downloaded on first use."""
    debian_version = DEBIAN_VERSIONS[version]
    packages = USER_PACKAGES + (SOURCE_PACKAGES if with_source else ())
    groups = [("user", USER_PACKAGES)] + ([("source", SOURCE_PACKAGES)] if with_source else [])
    found: dict[str, Path] = {}
    for kind, group in groups:
        dest = cache_root() / "debs" / version / kind
        with _locked(f"debs-{version}"):
            if not dest.is_dir():
                _download(group, debian_version, dest)
        for deb in dest.glob("*.deb"):
            found[deb.name.split("_", 1)[0]] = deb
    missing = set(packages) - set(found)
    if missing:
        raise RuntimeError(f"missing NVIDIA debs {sorted(missing)} in cache; delete "
                           f"{cache_root() / 'debs' / version} and retry")
    return found


def persistenced_deb() -> Path:
    """Debian bookworm's real nvidia-persistenced .deb, downloaded on first use."""
    dest = cache_root() / "debs" / "nvidia-persistenced" / PERSISTENCED_DEBIAN_VERSION
    with _locked("debs-nvidia-persistenced"):
        if not dest.is_dir():
            _download(("nvidia-persistenced",), PERSISTENCED_DEBIAN_VERSION, dest)
    found = sorted(dest.glob("nvidia-persistenced_*.deb"))
    if len(found) != 1:
        raise RuntimeError(f"expected one nvidia-persistenced .deb in {dest}; delete it and "
                           "retry")
    return found[0]


def nvidia_tree(version: str = DEFAULT_VERSION) -> Path:
    """The user-mode .debs of `version` extracted with `dpkg-deb -x` (cached)."""
    return extracted_tree(cache_root() / "trees" / version, LIB_DIR,
                          lambda: nvidia_debs(version).values(), f"tree-{version}")


def extracted_tree(tree: Path, lib_dir: str, debs: Callable[[], Iterable[Path]],
                   lock: str) -> Path:
    """`debs()` extracted with `dpkg-deb -x` into `tree` once (done when `lib_dir` exists)."""
    with _locked(lock):
        if not (tree / lib_dir).is_dir():
            tmp = tree.with_name(tree.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for deb in debs():
                subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
            shutil.rmtree(tree, ignore_errors=True)
            tmp.rename(tree)
    return tree
