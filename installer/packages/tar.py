"""Package tarballs: every header checked before a byte is written, never `tarfile.extract`.

The first pass reads only headers (and the small manifest.json): member count, names (no
absolute, `..`, repeated or control-character names), types (regular files and directories
only: no symbolic or hard link, device, FIFO or sparse file) and sizes, against the
generic bounds and, once the manifest is read, against exactly what it lists. So a small
tarball that claims a huge member is refused at that member's header. The second pass
writes the files with mode 0600; a tarball is unpacked once. Failures are one line, exit 7.
"""

from __future__ import annotations

import lzma
import shutil
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from installer.errors import DiskFullError, space_for
from installer.packages.manifest import (
    HASH_CHUNK,
    MANIFEST_NAME,
    MAX_FILE_SIZE,
    MAX_FILES,
    MAX_MANIFEST_BYTES,
    MAX_TOTAL_SIZE,
    Manifest,
    ManifestError,
    check_relpath,
    parse_manifest,
)

MAX_MEMBERS = MAX_FILES * 2  # files plus the directories that hold them
_READ_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError)
_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link",
          tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
          tarfile.FIFOTYPE: "a FIFO", tarfile.GNUTYPE_SPARSE: "a sparse file",
          tarfile.CONTTYPE: "a contiguous file"}


@dataclass
class _Scan:
    """What the header pass found: the members to write and the manifest, once read."""

    where: str
    files: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    dirs: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    total: int = 0
    manifest: Manifest | None = None
    manifest_error: ManifestError | None = None

    def fail(self, problem: str) -> ManifestError:
        return ManifestError(f"tarball {self.where}: {problem}")


def unpack_tarball(tar_path: Path, dest: Path, *, on_file: Callable[[Path], None] | None = None
                   ) -> Path:
    """Check every header of a package tarball, then extract it into the new dir `dest`.

    Files are written by this code (never by tarfile.extract) with mode 0600, so a member
    can neither escape `dest` nor carry a device, link, owner or setuid bit along.
    """
    scan = _Scan(str(tar_path))
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            for member in tar:
                _check_header(scan, tar, member)
            _check_complete(scan)
            _write_all(scan, tar, dest, on_file)
    except _READ_ERRORS as exc:
        raise ManifestError(f"{tar_path} is not a readable package tarball: {exc}") from None
    return dest


def _member_name(member: tarfile.TarInfo) -> str:
    name = member.name[2:] if member.name.startswith("./") else member.name
    return name.rstrip("/") if member.isdir() else name


def _kind(member: tarfile.TarInfo) -> str | None:
    """What a member is when it is not a plain file or directory, else None."""
    sparse = member.sparse is not None or any(key.startswith("GNU.sparse")
                                               for key in member.pax_headers)
    if sparse:
        return "a sparse file"
    if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE):
        return None
    return _KINDS.get(member.type, f"of tar type {member.type!r}")


def _check_header(scan: _Scan, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
    """One header: count, type, name, repetition, size; the manifest is read when met."""
    if len(scan.files) + len(scan.dirs) >= MAX_MEMBERS:
        raise scan.fail(f"has more than {MAX_MEMBERS} members")
    name = _member_name(member)
    if member.isdir() and name in ("", "."):
        return
    kind = _kind(member)
    if kind is not None:
        raise scan.fail(f"member {name!r} is {kind}; only regular files and directories are "
                        "allowed (no link or device)")
    check_relpath(name, f"tarball member {name!r}")
    if name in scan.files or name in scan.dirs:
        raise scan.fail(f"duplicate member {name!r}")
    if member.isdir():
        scan.dirs[name] = member
        return
    _check_size(scan, name, member.size)
    scan.files[name] = member
    if name == MANIFEST_NAME:
        _read_manifest(scan, tar, member)


def _check_size(scan: _Scan, name: str, size: int) -> None:
    """Within the bounds; once the manifest is known, exactly the size it lists."""
    scan.total += size
    if size > MAX_FILE_SIZE or scan.total > MAX_TOTAL_SIZE:
        raise scan.fail(f"member {name!r} claims {size} bytes, beyond the size limits "
                        f"({MAX_FILE_SIZE} per file, {MAX_TOTAL_SIZE} in all)")
    if scan.manifest is not None and name != MANIFEST_NAME:
        _check_listed(scan, scan.manifest, name, size)


def _check_listed(scan: _Scan, manifest: Manifest, name: str, size: int) -> None:
    try:
        entry = manifest.file(name)
    except KeyError:
        raise scan.fail(f"member {name!r} is not in the manifest") from None
    if entry.size != size:
        raise scan.fail(f"member {name!r} claims {size} bytes, the manifest says {entry.size}")


def _read_manifest(scan: _Scan, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
    """Parse manifest.json as soon as it is met; a bad one is reported after the scan."""
    if member.size > MAX_MANIFEST_BYTES:
        raise scan.fail(f"{MANIFEST_NAME} claims {member.size} bytes, more than the "
                        f"{MAX_MANIFEST_BYTES} allowed")
    source = tar.extractfile(member)
    data = source.read(MAX_MANIFEST_BYTES + 1) if source is not None else b""
    try:
        scan.manifest = parse_manifest(data, source=f"tarball {scan.where}")
    except ManifestError as exc:
        scan.manifest_error = exc
        return
    for name, info in scan.files.items():
        if name != MANIFEST_NAME:
            _check_listed(scan, scan.manifest, name, info.size)


def _check_complete(scan: _Scan) -> None:
    """The manifest was there and valid, and every file it lists is a member."""
    if scan.manifest_error is not None:
        raise scan.manifest_error
    if scan.manifest is None:
        raise scan.fail(f"has no {MANIFEST_NAME}")
    missing = [e.path for e in scan.manifest.files if e.path not in scan.files]
    if missing:
        raise scan.fail(f"the manifest lists {missing[0]!r} but the tarball lacks it")
    clash = sorted(set(scan.files) & {d for name in scan.files
                                      for d in _parents(name)})
    if clash:
        raise scan.fail(f"member {clash[0]!r} is both a file and a directory")


def _write_all(scan: _Scan, tar: tarfile.TarFile, dest: Path,
               on_file: Callable[[Path], None] | None) -> None:
    """Every member into `dest`; on a full filesystem `dest` is removed whole."""
    needed = sum(member.size for member in scan.files.values())
    try:
        with space_for(dest, needed):
            dest.mkdir(parents=True)
            for name in sorted(scan.dirs):
                (dest / name).mkdir(parents=True, exist_ok=True)
            for name, member in scan.files.items():
                _extract(scan, tar, member, dest / name)
                if on_file is not None:
                    on_file(dest / name)
    except DiskFullError:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _extract(scan: _Scan, tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    """Write exactly the size the header (and manifest) gave, mode 0600, never through a link."""
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    if source is None:
        raise scan.fail(f"member {member.name!r} cannot be read")
    left = member.size
    with source, target.open("xb") as out:
        target.chmod(0o600)
        while left and (chunk := source.read(min(HASH_CHUNK, left))):
            out.write(chunk)
            left -= len(chunk)
    if left:
        raise scan.fail(f"member {member.name!r} ends {left} bytes early")
