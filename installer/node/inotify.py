"""inotify(7) through libc, non-blocking: the agent asks each round whether anything it
watches changed, and never waits on the descriptor.

Only what a caller names counts: each watch is a directory and a test on the names of the
entries that change in it (`vmlinuz*` in `/`, `reboot-required*` in `/var/run`); events on
other names are read and dropped, so a busy `/run` costs a read per round, never a look.
A queue overflow (IN_Q_OVERFLOW) counts as a change: something may have been missed. A
watch that cannot be added (the directory is absent, the watch limit reached) is simply
not there; the caller's periodic scan covers it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable
from pathlib import Path

IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
CHANGES = (IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
           | IN_DELETE_SELF | IN_ATTRIB)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
READ_SIZE = 64 * 1024
MAX_READS = 64  # per call: a flood is read at most this much per round, the rest next time

Names = Callable[[str], bool]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class Watcher:
    """One inotify instance: directories watched by name filter, polled without waiting."""

    def __init__(self) -> None:
        self._lib = _libc()
        fd = self._lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int | None = fd
        self._watches: dict[int, tuple[Path, Names]] = {}

    def watch(self, directory: Path, names: Names) -> bool:
        """Watch `directory` (a directory, not followed if a link) for entries whose name
        `names` accepts; False when it cannot be watched."""
        if self.fd is None:
            return False
        wd = self._lib.inotify_add_watch(self.fd, os.fsencode(directory),
                                         CHANGES | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd < 0:
            return False
        self._watches[wd] = (directory, names)
        return True

    def watched(self) -> list[Path]:
        return [path for path, _ in self._watches.values()]

    def changed(self) -> list[str]:
        """What changed since the last call (`dir/name` of each accepted event, or
        `overflow`), reading only what is queued now."""
        found: list[str] = []
        for _ in range(MAX_READS):
            if self.fd is None:
                break
            try:
                data = os.read(self.fd, READ_SIZE)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    break
                raise
            if not data:
                break
            found += self._parse(data)
        return found

    def _parse(self, data: bytes) -> list[str]:
        found: list[str] = []
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size: offset + _HEADER.size + length]
            offset += _HEADER.size + length
            name = os.fsdecode(raw.rstrip(b"\0"))
            if mask & IN_Q_OVERFLOW:
                found.append("overflow")
                continue
            watch = self._watches.get(wd)
            if mask & IN_IGNORED:
                self._watches.pop(wd, None)  # the directory went: watch it again later
                found.append(f"{watch[0] if watch else '?'} (gone)")
                continue
            if watch is not None and (mask & IN_DELETE_SELF or watch[1](name)):
                found.append(f"{watch[0]}/{name}")
        return found

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def open_watcher() -> Watcher | None:
    """An inotify instance, or None where the kernel or its limits refuse one."""
    try:
        return Watcher()
    except (OSError, AttributeError):
        return None
