"""The staged versions and the one link that says which is in service.

`.current -> .versions/<name>` is switched with one rename, so lib64, bin, drivers and
firmware (which point through `.current`) change together; `.previous` remembers the
version it replaced, for rollback and for restoring after a failed install.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from installer.installdir.layout import CURRENT, PREVIOUS, STAGED_META, TOP_LINKS, VERSIONS
from installer.installdir.ownership import move_aside
from installer.node.host import fsync_dir, replace_symlink
from installer.packages.documents import DocumentError, read_document, read_file

MAX_META_BYTES = 64 * 1024


def current_name(root: Path) -> str | None:
    """The version directory `.current` points at, or None."""
    return _link_name(root / CURRENT)


def previous_name(root: Path) -> str | None:
    return _link_name(root / PREVIOUS)


def _link_name(link: Path) -> str | None:
    try:
        return PurePosixPath(os.readlink(link)).name
    except OSError:
        return None


def read_staged(root: Path, name: str) -> dict[str, Any] | None:
    """The metadata a complete version directory carries, or None."""
    return _read_meta(root / VERSIONS / name)


def staged_digest(version_dir: Path) -> str | None:
    """The package digest a complete version directory was built from, or None."""
    meta = _read_meta(version_dir)
    digest = meta.get("digest") if meta else None
    return digest if isinstance(digest, str) else None


def _read_meta(version_dir: Path) -> dict[str, Any] | None:
    """The metadata, or None when absent or malformed (the version is then rebuilt)."""
    path = version_dir / STAGED_META
    try:
        data = read_file(path, MAX_META_BYTES)
        return None if data is None else read_document(
            data, name=STAGED_META, source=str(version_dir), limit=MAX_META_BYTES)
    except DocumentError:
        return None


def switch_to(root: Path, name: str) -> str | None:
    """Point `.current` at a complete version; remember the one it replaces as `.previous`."""
    old = current_name(root)
    if old and old != name and (root / VERSIONS / old).is_dir():
        replace_symlink(root / PREVIOUS, f"{VERSIONS}/{old}")
    replace_symlink(root / CURRENT, f"{VERSIONS}/{name}")
    _ensure_top_links(root)
    fsync_dir(root)
    return old if old != name else previous_name(root)


def _ensure_top_links(root: Path) -> None:
    """lib64, bin, drivers, firmware -> .current/<same>.

    A real directory or file of that name is not ours: it moves into `.pre-existing/`, which
    nothing prunes and `uninstall` restores (never into `.versions/`, which is pruned).
    """
    for sub in TOP_LINKS:
        link = root / sub
        want = f"{CURRENT}/{sub}"
        if link.is_symlink() and os.readlink(link) == want:
            continue
        if link.exists() and not link.is_symlink():
            move_aside(root, [sub])
        replace_symlink(link, want)
