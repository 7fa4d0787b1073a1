"""The .deb reader of `package build`: an ar archive whose `control.tar` and `data.tar`
members are compressed as dpkg-deb writes them (gzip, xz, zstd, bzip2, lzma or none).

Read without dpkg, as a stream: each member is decompressed while tarfile reads it, so
nothing is spooled to a temporary file and no member is held whole in memory. zstd (Ubuntu
builds its packages with `dpkg-deb -Zzstd`) is decoded by `zstandard`, the others by the
standard library; each decoder is imported only when a member needs it. Data is unpacked
with tarfile's `data` filter: no member and no link lands outside the destination. Failures
are `DebFileError`s, one line each with its remedy (`inputs` makes them PackageBuildErrors).
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from installer.errors import disk_full

# a .deb member's suffix -> its compression: what dpkg-deb(1) -Z writes, and lzma, which
# dpkg still reads
COMPRESSIONS = {"": "none", ".gz": "gzip", ".xz": "xz", ".zst": "zstd", ".bz2": "bzip2",
                ".lzma": "lzma"}
DAMAGED = "download the package again (this file is damaged or truncated)"
CONTROL_LIMIT = 1024 * 1024  # a control file is a few KiB
PADDING_READ = 1024 * 1024  # dpkg-deb pads its tar archives to a 10 KiB record


class DebFileError(Exception):
    """A .deb that cannot be read: the message names the package and the member."""

    def __init__(self, message: str, *, remedy: str = DAMAGED) -> None:
        super().__init__(message)
        self.message, self.remedy = message, remedy


def unpack(deb: Path, dest: Path, *, skip_outside_links: bool = False) -> None:
    """Unpack a .deb's data archive into `dest`; unsafe members are refused.

    `skip_outside_links` leaves out links that point outside `dest` (a headers package's
    `/lib/modules/<release>/build` link) instead of refusing the package.
    """
    def extract(archive: tarfile.TarFile) -> None:
        # safe: both filters are tarfile's "data" filter (the first drops links that would
        # point outside instead of refusing the whole archive)
        archive.extractall(dest, filter=_skip_outside_links  # noqa: S202
                           if skip_outside_links else "data")

    _read_member(deb, "data.tar", extract, dest)


def control(deb: Path) -> dict[str, str]:
    """The fields of a .deb's `control` file (Package, Version, Architecture, ...)."""
    found: list[bytes] = []

    def read(archive: tarfile.TarFile) -> None:
        for member in archive:
            if member.name in ("./control", "control") and member.isfile():
                if member.size > CONTROL_LIMIT:
                    raise DebFileError(f"{deb}: its control file is over {CONTROL_LIMIT} "
                                       "bytes", remedy="give the package as its distribution "
                                                       "published it")
                stream = archive.extractfile(member)
                found.append(stream.read() if stream else b"")
                return

    _read_member(deb, "control.tar", read, None)
    if not found:
        raise DebFileError(f"{deb}: its control archive has no control file")
    text = found[0].decode("utf-8", "replace")
    return {key.strip(): value.strip() for key, _, value in
            (line.partition(":") for line in text.splitlines() if line[:1] not in " \t#")}


def _read_member(deb: Path, stem: str, use: Callable[[tarfile.TarFile], None],
                 dest: Path | None) -> None:
    """Hand the first member named `stem[.<compression>]` to `use` as a tar stream: read
    while decompressed, never spooled to a file or held whole in memory."""
    try:
        with deb.open("rb") as handle:
            if handle.read(8) != b"!<arch>\n":
                raise DebFileError(f"{deb} is not a Debian package (no ar header)",
                                   remedy="give a .deb file (an ar archive)")
            for name, size in _ar_members(deb, handle):
                if name.startswith(stem):
                    _read_tar(deb, name, _ArMember(handle, size), use, dest)
                    return
                handle.seek(size + size % 2, os.SEEK_CUR)
    except OSError as exc:
        raise disk_full(exc, dest) or DebFileError(
            f"cannot read {deb}: {exc.strerror or exc}") from None
    raise DebFileError(f"{deb} has no {stem} member")


def _read_tar(deb: Path, name: str, member: _ArMember,
              use: Callable[[tarfile.TarFile], None], dest: Path | None) -> None:
    suffix = name[len(name.split(".tar", 1)[0]) + 4:]
    if suffix not in COMPRESSIONS:
        raise DebFileError(
            f"{deb}: cannot unpack {name}: unknown compression {suffix.lstrip('.')!r} (dpkg "
            "writes gzip, xz, zstd, bzip2, lzma or none)",
            remedy="repack it with `dpkg-deb -Zxz` (or -Zzstd, -Zgzip, -Znone)")
    compression = COMPRESSIONS[suffix]
    stream, damaged = _decompressed(member, compression)
    damaged += (tarfile.TarError, EOFError)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            use(archive)
        stream.read(PADDING_READ)  # to the end: the decoder checks gzip's CRC, which is last
    except tarfile.FilterError as exc:
        raise DebFileError(f"{deb}: cannot unpack {name}: {one_line(exc)}",
                           remedy="use the distribution's own package: this one holds a "
                                  "member that would land outside the folder it is unpacked "
                                  "into") from None
    except OSError as exc:  # gzip's and bzip2's decoders say damage as an OSError, no errno
        if exc.errno is not None:
            raise disk_full(exc, dest) or DebFileError(
                f"{deb}: cannot unpack {name}: {one_line(exc)}") from None
        raise _damaged(deb, name, compression, exc) from None
    except damaged as exc:
        raise _damaged(deb, name, compression, exc) from None


def _damaged(deb: Path, name: str, compression: str, exc: BaseException) -> DebFileError:
    return DebFileError(f"{deb}: cannot unpack {name}: not valid {compression}-compressed tar "
                        f"data ({one_line(exc)})")


def _decompressed(member: _ArMember, compression: str
                  ) -> tuple[IO[bytes], tuple[type[Exception], ...]]:
    """The member decompressed as it is read, and what its decoder raises on damaged data
    (besides EOFError). Each decoder is imported only when a member needs it."""
    raw = cast(IO[bytes], member)
    if compression == "gzip":
        import gzip
        import zlib

        return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")), (zlib.error,)
    if compression in ("xz", "lzma"):
        import lzma

        return cast(IO[bytes], lzma.LZMAFile(raw)), (lzma.LZMAError,)
    if compression == "bzip2":
        import bz2

        return cast(IO[bytes], bz2.BZ2File(raw)), ()
    if compression == "zstd":
        import zstandard

        # frames concatenated (`zstd -T`) are one stream to dpkg, so they are read as one
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return cast(IO[bytes], reader), (zstandard.ZstdError,)
    return raw, ()


def _ar_members(deb: Path, handle: BinaryIO) -> Iterator[tuple[str, int]]:
    """(name, size) of each member of an ar archive, the handle left at its data."""
    while header := handle.read(60):
        size = header[48:58].strip()
        if len(header) < 60 or header[58:60] != b"`\n" or not size.isdigit():
            raise DebFileError(f"{deb} has a damaged ar header")
        yield header[:16].decode("ascii", "replace").strip().rstrip("/"), int(size)


class _ArMember(io.RawIOBase):
    """One member of an open ar archive: reads end where the member ends."""

    def __init__(self, handle: BinaryIO, size: int) -> None:
        super().__init__()
        self._handle, self._left = handle, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._handle.read(min(len(buffer), self._left))
        buffer[:len(data)] = data
        self._left -= len(data)
        return len(data)


def _skip_outside_links(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    try:
        return tarfile.data_filter(member, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (tarfile's own messages span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
