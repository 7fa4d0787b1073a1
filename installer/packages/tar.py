"""Package tarballs: unpacked only through checks, never by `tarfile.extract`.

A member that is a link, device or FIFO, that escapes the root, repeats, or exceeds the size
bounds is refused with one line (exit 7); files are written by this code with mode 0600.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from installer.packages.manifest import (
    HASH_CHUNK,
    MAX_FILE_SIZE,
    MAX_FILES,
    MAX_TOTAL_SIZE,
    ManifestError,
    check_relpath,
)


def _member_name(member: tarfile.TarInfo) -> str:
    name = member.name[2:] if member.name.startswith("./") else member.name
    return name.rstrip("/") if member.isdir() else name


def _tar_members(tar: tarfile.TarFile, where: str) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """Every member, refused unless a plain file or directory with a safe relative name."""
    total = 0
    for count, member in enumerate(tar, start=1):
        name = _member_name(member)
        if count > MAX_FILES * 2:
            raise ManifestError(f"tarball {where} has more than {MAX_FILES * 2} members")
        if member.isdir() and name in ("", "."):
            continue
        if not (member.isfile() or member.isdir()):
            raise ManifestError(f"tarball {where}: member {name!r} is a link or device; only "
                                "regular files and directories are allowed")
        check_relpath(name, f"tarball member {name!r}")
        total += member.size
        if member.size > MAX_FILE_SIZE or total > MAX_TOTAL_SIZE:
            raise ManifestError(f"tarball {where}: member {name!r} exceeds the size limits")
        yield name, member


def unpack_tarball(tar_path: Path, dest: Path, *, on_file: Callable[[Path], None] | None = None
                   ) -> Path:
    """Extract a package tarball into the new directory `dest`, refusing unsafe members.

    Files are written by this code (never by tarfile.extract) with mode 0600, so a member
    can neither escape `dest` nor carry a device, link, owner or setuid bit along.
    """
    dest.mkdir(parents=True)
    seen: set[str] = set()
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            for name, member in _tar_members(tar, str(tar_path)):
                if name in seen:
                    raise ManifestError(f"tarball {tar_path}: duplicate member {name!r}")
                seen.add(name)
                _extract_member(tar, member, dest / name)
                if on_file is not None and member.isfile():
                    on_file(dest / name)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ManifestError(f"{tar_path} is not a readable package tarball: {exc}") from None
    return dest


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        raise ManifestError(f"tarball member {member.name!r} clashes with a directory")
    source = tar.extractfile(member)
    if source is None:
        raise ManifestError(f"tarball member {member.name!r} cannot be read")
    with source, target.open("xb") as out:
        target.chmod(0o600)
        while chunk := source.read(HASH_CHUNK):
            out.write(chunk)
