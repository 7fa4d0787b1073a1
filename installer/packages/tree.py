"""Package directories on local disk: hash a file, check it against its entry, open a tree.

Used by every source that holds files (preloaded dir, unpacked tarball, cache) and by load's
preflight; the manifest model and its validation are in `installer.packages.manifest`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from installer.packages.manifest import (
    HASH_CHUNK,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    FileEntry,
    ManifestError,
    Package,
    PackageFileError,
    parse_manifest,
    sha256_hex,
)


def hash_file(path: Path, size_limit: int) -> tuple[int, str]:
    """Size and sha256 of a regular file, reading at most `size_limit + 1` bytes."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb", buffering=0) as handle:
        while chunk := handle.read(min(HASH_CHUNK, size_limit + 1 - size)):
            digest.update(chunk)
            size += len(chunk)
            if size > size_limit:
                break
    return size, digest.hexdigest()


def linked_directory(root: Path, relpath: str) -> str | None:
    """The first directory on the way from `root` to `relpath` that is a symbolic link
    (`lib64 -> /elsewhere` would let a package stage files it does not hold), else None."""
    parts = relpath.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        if (root / "/".join(parts[:depth])).is_symlink():
            return "/".join(parts[:depth])
    return None


def verify_file(path: Path, entry: FileEntry, where: str, root: Path | None = None) -> None:
    """Check a local file against its entry: a regular file reached through real
    directories (under `root`, when given), its size, then its sha256."""
    linked = linked_directory(root, entry.path) if root is not None else None
    if linked is not None:
        raise PackageFileError(f"{where}: {linked}/ is a symbolic link (on the way to "
                               f"{entry.path}); a package's directories must be real",
                               remedy="replace the link with the directory's own files "
                               "and republish the package")
    if path.is_symlink() or not path.is_file():
        raise PackageFileError(f"{where}: {entry.path} is missing or not a regular file")
    if path.stat().st_size != entry.size:
        raise PackageFileError(f"{where}: {entry.path} is {path.stat().st_size} bytes, "
                               f"the manifest says {entry.size}")
    _, digest = hash_file(path, entry.size)
    if digest != entry.sha256:
        raise PackageFileError(f"{where}: {entry.path} sha256 {digest[:16]}... differs from "
                               f"the manifest's {entry.sha256[:16]}...")


def read_tree(root: Path, source: str = "") -> Package:
    """Open a package directory: parse its manifest and verify every file it lists."""
    manifest_path = root / MANIFEST_NAME
    if manifest_path.is_symlink() or not manifest_path.is_file():
        raise ManifestError(f"{root} has no {MANIFEST_NAME}")
    with manifest_path.open("rb") as handle:
        data = handle.read(MAX_MANIFEST_BYTES + 1)
    manifest = parse_manifest(data, source=str(root))
    for entry in manifest.files:
        verify_file(root / entry.path, entry, str(root), root)
    return Package(manifest, sha256_hex(data), root, by_hash=False, source=source or str(root))
