"""file:// mirrors: every path decoded once, resolved, and kept inside the mirror's root.

A file:// mirror's base and the relative paths its index and manifest name are
percent-decoded the way an HTTP server would decode them, and refused (exit 7, naming the
path) when a decoded segment is '..', '.', empty, holds an encoded '/' or a NUL; the
resolved file (symlinks followed) must still lie under the resolved mirror root. Only
regular files are read: a FIFO or a device named by a hostile tree cannot block the run.
"""

from __future__ import annotations

import contextlib
import os
import stat
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from installer.errors import DownloadError, IntegrityError
from installer.stages.fetch.failures import NotOnMirror
from installer.stages.fetch.urls import UnsafePathError, check_relpath, safe


def mirror_root(base: str) -> Path:
    """The resolved directory a file:// base URL names (its path checked like any other)."""
    path = urllib.parse.urlsplit(base).path.strip("/")
    decoded = check_relpath(path, f"mirror {safe(base)}") if path else ""
    return Path(os.path.realpath("/" + decoded))


def contained_url(root: Path, relpath: str, where: str) -> str:
    """The file:// URL of `relpath` under `root`, refused if it would leave the root."""
    target = Path(os.path.realpath(root / check_relpath(relpath, where)))
    if not target.is_relative_to(root):
        raise UnsafePathError(f"{where}: path {relpath[:200]!r} resolves to {target}, "
                              f"outside the mirror root {root}")
    return file_url(target)


def file_url(path: Path) -> str:
    return "file://" + urllib.parse.quote(str(os.path.abspath(path)))


def local_path(url: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))


@contextlib.contextmanager
def open_local(url: str) -> Iterator[BinaryIO]:
    """A regular file named by a file:// URL, opened without blocking on a FIFO."""
    shown = safe(url)
    try:
        fd = os.open(local_path(url), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise NotOnMirror(f"{shown} does not exist") from None
    except ValueError:  # an embedded NUL
        raise UnsafePathError(f"{shown}: the path holds a NUL character") from None
    except OSError as exc:
        raise DownloadError(f"cannot read {shown}: {exc.strerror}") from None
    handle = os.fdopen(fd, "rb")
    with handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise NotOnMirror(f"{shown} is a directory")
        if not stat.S_ISREG(mode):
            raise IntegrityError(f"{shown} is not a regular file",
                                 remedy="a file:// mirror must hold plain files")
        os.set_blocking(fd, True)
        yield handle


def read_local(url: str, limit: int, oversize: type[IntegrityError] = IntegrityError
               ) -> bytes:
    """A small document from a file:// mirror, at most `limit` bytes."""
    with open_local(url) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise DownloadError(f"cannot read {safe(url)}: {exc.strerror}") from None
    if len(data) > limit:
        raise oversize(f"{safe(url)} is larger than the {limit} bytes allowed")
    return data
