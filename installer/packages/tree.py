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


def verify_file(path: Path, entry: FileEntry, where: str) -> None:
    """Check a local file against its entry: a regular file, its size, then its sha256."""
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
        verify_file(root / entry.path, entry, str(root))
    return Package(manifest, sha256_hex(data), root, by_hash=False, source=source or str(root))
