"""Driver packages for stage/verify tests, made from the real NVIDIA user-mode files.

The package points straight into the cached `dpkg-deb -x` tree (`by_hash=False`), so no
137 MB copy is made per test; the manifest carries the files' real sizes, sha256 and modes.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from installer.packages.manifest import FileEntry, Manifest, Package, dump_manifest

LIB_DIR = "usr/lib/x86_64-linux-gnu/nvidia/current"
SMI = "usr/lib/nvidia/current/nvidia-smi"
KERNEL = "6.1.0-26-cloud-amd64"


def _entry(tree: Path, relpath: str, kind: str) -> FileEntry:
    path = tree / relpath
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    return FileEntry(relpath, path.stat().st_size, digest.hexdigest(), mode, kind)


def tree_package(tree: Path, version: str, *, kernel: str = KERNEL,
                 flavour: str = "proprietary", only: tuple[str, ...] = ()) -> Package:
    """A Package of the tree's real libraries (regular files only) and nvidia-smi.

    `only` keeps the libraries whose names start with one of its prefixes.
    """
    libs = sorted(p for p in (tree / LIB_DIR).iterdir()
                  if p.is_file() and not p.is_symlink()
                  and (not only or p.name.startswith(only)))
    files = [_entry(tree, f"{LIB_DIR}/{p.name}", "library") for p in libs]
    files.append(_entry(tree, SMI, "binary"))
    manifest = Manifest(schema_version=1, driver_version=version, kernel_release=kernel,
                        arch="x86_64", flavour=flavour, os=None, files=tuple(files),
                        modules=())
    digest = hashlib.sha256(dump_manifest(manifest)).hexdigest()
    return Package(manifest=manifest, digest=digest, root=tree, by_hash=False,
                   source="test-tree")


def standin_tree(tree: Path, built: Path, version: str) -> Path:
    """A tree shaped like Debian's extraction holding compiled stand-ins (see native/)."""
    import shutil

    lib_dir = tree / LIB_DIR
    lib_dir.mkdir(parents=True)
    shutil.copy(built / "libnvidia-ml.so.1", lib_dir / f"libnvidia-ml.so.{version}")
    shutil.copy(built / "libcuda.so.1", lib_dir / f"libcuda.so.{version}")
    smi = tree / SMI
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\necho stand-in\n")
    smi.chmod(0o755)
    return tree
