"""One bounded reader for every file the installer reads as a document or a record.

A path given by an operator, a mirror or the node may name a FIFO (an open for reading
blocks until a writer comes, a read until it writes), a device (`/dev/zero` never ends), a
socket or a directory. `read_regular` refuses each of them by name before reading a byte:
it looks at the file first, opens it non-blocking and without taking a terminal, checks the
opened file again (it may have been swapped in between), and reads at most `limit + 1`
bytes, so an oversized file is said to be so rather than read whole.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from installer.errors import InstallerError, UnsupportedNodeError

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """What a file of this mode is, as a refusal names it."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


class NotRegularFile(OSError):
    """The path names something else than a regular file (its kind is in the message)."""


class NodeFileError(UnsupportedNodeError, OSError):
    """A node path read as a file is a FIFO, device, socket or directory. Where a caller
    treats an unreadable file as absent (it catches OSError) it is one; anywhere else it is
    exit 4 naming the path and its kind."""

    def __init__(self, path: Path, kind: str) -> None:
        message = f"{path} is {kind}, not a regular file"
        super().__init__(message, remedy="remove what was put in its place (the installer "
                                         "reads only regular files there)")
        self.strerror = message


def read_regular(path: Path, limit: int, *, error: type[InstallerError],
                 name: str | None = None, oversize: bool = True,
                 remedy: str = "point it at a regular file") -> bytes | None:
    """The bytes of a regular file of at most `limit` bytes, None when it is absent.

    Anything else is `error` naming the file (`name`, else the path) and the cause: its kind
    (a FIFO, a device, a socket, a directory), the OS's reason it cannot be read, or the
    limit it exceeds. With `oversize=False`, up to `limit + 1` bytes come back instead, for a
    parser that names the limit itself."""
    what = name or str(path)
    try:
        data = read_capped(path, limit + 1)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        raise error(f"{what} is {exc.strerror}, not a regular file", remedy=remedy) from None
    except OSError as exc:
        raise error(f"{what} cannot be read: {exc.strerror or type(exc).__name__}") from None
    if oversize and len(data) > limit:
        raise error(f"{what} is larger than {_size(limit)} (the limit)",
                    remedy="point it at the intended file (it is far smaller)")
    return data


def read_capped(path: Path, count: int) -> bytes:
    """At most `count` bytes of a regular file; NotRegularFile naming its kind, or the
    OSError of the open or read (FileNotFoundError when it is absent)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:  # a component is a file, so this path is absent
            raise FileNotFoundError(exc.errno, exc.strerror, str(path)) from None
        raise
    if not stat.S_ISREG(mode):
        raise NotRegularFile(0, kind_of(mode), str(path))
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped in after the first look
            raise NotRegularFile(0, kind_of(mode), str(path))
        chunks: list[bytes] = []
        left = count
        while left > 0:
            chunk = os.read(fd, min(left, 65536))  # procfs, sysfs: ENOMEM on huge counts
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _size(limit: int) -> str:
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if limit >= size and limit % size == 0:
            return f"{limit // size} {unit}"
    return f"{limit} bytes"
