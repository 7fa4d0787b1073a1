"""Small synthetic driver packages and repositories for fetch tests (real ones: packagebuild).

    manifest, data = write_package(repo, version="535.261.03", files={"lib64/a.so": b"..."})
    write_index(repo, aliases={"default": "535.261.03"})
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

from installer.packages.manifest import FileEntry, Manifest, ModuleEntry, dump_manifest
from installer.packages.repository import (
    Candidate,
    Index,
    index_to_bytes,
    package_path,
    with_package,
)

KERNEL = "6.1.0-26-cloud-amd64"
DEFAULT_FILES: dict[str, bytes] = {
    "lib64/libnvidia-ml.so.535.261.03": b"\x7fELF fake nvml " * 200,
    "bin/nvidia-smi": b"#!/bin/sh\necho fake\n",
    "modules/nvidia.ko": b"fake nvidia module" * 100,
    "modules/nvidia-uvm.ko": b"fake uvm module" * 100,
}


def _kind(path: str) -> str:
    top = path.split("/", 1)[0]
    return {"lib64": "library", "bin": "binary", "modules": "module",
            "firmware": "firmware"}.get(top, "config")


def write_package(repo: Path, *, kernel: str = KERNEL, version: str = "535.261.03",
                  flavour: str = "proprietary", arch: str = "x86_64",
                  files: dict[str, bytes] | None = None, big: dict[str, Path] | None = None,
                  os_match: dict[str, str] | None = None) -> tuple[Manifest, bytes]:
    """Write `<repo>/<kernel>/<version>/<flavour>[-<arch>]/` with its files and manifest.json."""
    root = repo / package_path(kernel, version, flavour, arch)
    entries = []
    for relpath, data in (DEFAULT_FILES if files is None else files).items():
        target = root / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        entries.append(FileEntry(relpath, len(data), hashlib.sha256(data).hexdigest(),
                                 0o755 if _kind(relpath) == "binary" else 0o644, _kind(relpath)))
    for relpath, source in (big or {}).items():
        target = root / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.hardlink_to(source)
        except OSError:  # another filesystem
            shutil.copyfile(source, target)
        entries.append(FileEntry(relpath, source.stat().st_size, _sha256(source), 0o644,
                                 _kind(relpath)))
    modules = _modules([e.path for e in entries])
    manifest = Manifest(1, version, kernel, arch, flavour, os_match, tuple(entries), modules)
    data = dump_manifest(manifest)
    (root / "manifest.json").write_bytes(data)
    return manifest, data


def _modules(paths: list[str]) -> tuple[ModuleEntry, ...]:
    modules = []
    if "modules/nvidia.ko" in paths:
        modules.append(ModuleEntry("nvidia", "modules/nvidia.ko", ("drm",), {}))
    if "modules/nvidia-uvm.ko" in paths:
        modules.append(ModuleEntry("nvidia_uvm", "modules/nvidia-uvm.ko", ("nvidia",), {}))
    return tuple(modules)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_index(repo: Path, aliases: dict[str, str] | None = None) -> Index:
    """index.json listing every package under `repo` (with manifest digests)."""
    index = Index()
    for manifest_path in sorted(repo.glob("*/*/*/manifest.json")):
        data = manifest_path.read_bytes()
        obj: dict[str, Any] = json.loads(data)
        path = package_path(obj["kernel_release"], obj["driver_version"], obj["flavour"],
                            obj["arch"])
        index = with_package(index, Candidate(
            obj["driver_version"], obj["kernel_release"], obj["arch"], obj["flavour"], path,
            hashlib.sha256(data).hexdigest(), obj["os"]))
    index = Index(index.packages, dict(aliases or {}))
    (repo / "index.json").write_bytes(index_to_bytes(index))
    return index


def tar_package(tree: Path, tarball: Path) -> Path:
    """A tarball of a package directory (members relative to its root)."""
    with tarfile.open(tarball, "w:gz") as tar:
        for path in sorted(tree.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(tree)), recursive=False)
    return tarball
