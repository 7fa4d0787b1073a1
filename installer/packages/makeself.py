"""NVIDIA's `.run` installers are makeself archives: a shell header, then a compressed tar.

We never execute the header (it is a downloaded shell script, and we run as root on the
node): its `skip` line count says where the payload starts, its `filesizes` how long it
is, and its `MD5`/`SHA` lines (when makeself wrote them) are checked over those bytes before
the payload is unpacked with tarfile's `data` filter (no absolute or `..` names, no links
out of the target, no devices, no setuid bits).
"""

from __future__ import annotations

import hashlib
import lzma
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from installer.errors import IntegrityError

HEADER_LIMIT = 64 * 1024  # NVIDIA's headers are about 20 KiB
_SKIP_RES = (re.compile(rb'^skip="(\d+)"', re.M),
             re.compile(rb'head -n "?(\d+)"? "?\$[0-9]"?', re.M))
_SIZES_RE = re.compile(rb'^filesizes="([\d ]+)"', re.M)
_MD5_RE = re.compile(rb'^MD5="([0-9a-f ]+)"', re.M)
_SHA_RE = re.compile(rb'^SHA="([0-9a-f ]+)"', re.M)
_MAGICS = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2",
           b"\x28\xb5\x2f\xfd": "zstd"}
_READ_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError)


class RunfileError(IntegrityError):
    """A `.run` file is not a makeself archive we can read, or its own checksum fails."""

    default_remedy = "fetch NVIDIA's NVIDIA-Linux-<arch>-<version>.run again (complete, unaltered)"


@dataclass(frozen=True)
class Payload:
    """Where the archive is inside the `.run` and what its header says it must hash to."""

    offset: int
    size: int
    md5: str | None
    sha256: str | None
    compression: str


def read_header(run_file: Path) -> Payload:
    """Parse the makeself header without running it."""
    with run_file.open("rb") as handle:
        head = handle.read(HEADER_LIMIT)
        total = handle.seek(0, 2)
    if not head.startswith(b"#!") or b"makeself" not in head.lower():
        raise RunfileError(f"{run_file.name} is not a makeself .run archive")
    lines = next((int(m.group(1)) for r in _SKIP_RES if (m := r.search(head))), None)
    if lines is None:
        raise RunfileError(f"{run_file.name}: its makeself header names no payload offset")
    offset = _line_offset(head, lines, run_file.name)
    sizes = _SIZES_RE.search(head)
    size = int(sizes.group(1).split()[0]) if sizes else total - offset
    if offset + size > total:
        raise RunfileError(f"{run_file.name} is truncated: its header promises {size} "
                           f"payload bytes, {total - offset} follow")
    magic = head[offset:offset + 6]
    compression = next((name for m, name in _MAGICS.items() if magic.startswith(m)), "tar")
    return Payload(offset, size, _digest(_MD5_RE, head, 32), _digest(_SHA_RE, head, 64),
                   compression)


def _line_offset(head: bytes, lines: int, name: str) -> int:
    """The byte offset after `lines` newlines (makeself counts with `head -n`)."""
    offset = 0
    for _ in range(lines):
        offset = head.find(b"\n", offset) + 1
        if offset == 0:
            raise RunfileError(f"{name}: its makeself header is longer than "
                               f"{HEADER_LIMIT} bytes or cut short")
    return offset


def _digest(pattern: re.Pattern[bytes], head: bytes, width: int) -> str | None:
    """The header's checksum of the (first) archive; makeself writes zeros when it has none."""
    match = pattern.search(head)
    value = match.group(1).split()[0].decode() if match else ""
    return value if len(value) == width and value.strip("0") else None


class _Window:
    """A read-only view of `size` bytes from `offset`, hashing what passes through."""

    def __init__(self, handle: IO[bytes], offset: int, size: int) -> None:
        handle.seek(offset)
        self.handle, self.left = handle, size
        self.md5, self.sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.handle.read(size)
        self.left -= len(data)
        self.md5.update(data)
        self.sha256.update(data)
        return data


def extract(run_file: Path, dest: Path) -> Payload:
    """Unpack the payload into the new directory `dest`; raise RunfileError when it fails
    its header's own checksum or is not a readable tar."""
    payload = read_header(run_file)
    if payload.compression == "zstd":
        raise RunfileError(f"{run_file.name} is compressed with zstd, which this Python "
                           "cannot read", remedy="repack it with gzip or xz")
    dest.mkdir(parents=True)
    with run_file.open("rb") as handle:
        window = _Window(handle, payload.offset, payload.size)
        try:
            with tarfile.open(fileobj=window, mode="r|*") as archive:  # type: ignore[call-overload]
                archive.extractall(dest, filter="data")
            while window.read(1 << 20):  # hash the tail the tar reader did not need
                pass
        except _READ_ERRORS as exc:
            raise RunfileError(f"{run_file.name}: its payload does not unpack ({exc})") from None
    _check(run_file.name, "MD5", payload.md5, window.md5.hexdigest())
    _check(run_file.name, "SHA256", payload.sha256, window.sha256.hexdigest())
    return payload


def _check(name: str, what: str, expected: str | None, actual: str) -> None:
    if expected is not None and expected != actual:
        raise RunfileError(f"{name}: its payload's {what} is {actual[:16]}..., the header "
                           f"says {expected[:16]}... (damaged or altered)")
