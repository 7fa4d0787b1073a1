"""The node lock: two installer runs on one node never interleave.

`flock(2)` on `<install dir>/.lock` (the install dir is on the node, so two containers on
the same node share the lock; the kernel drops it when the holder dies, so a SIGKILLed run
never leaves a stale lock). The holder writes its PID for the "lock held" message.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from installer.errors import LockHeldError, StagingError
from installer.node.files import read_capped

POLL_SECONDS = 0.2
WaitHook = Callable[[int | None], None]


@contextmanager
def node_lock(path: Path, *, timeout: float, on_wait: WaitHook | None = None) -> Iterator[None]:
    """Hold the lock for the duration of the block; wait up to `timeout` seconds for it."""
    fd = _open(path)
    try:
        _acquire(fd, path, timeout, on_wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise StagingError(f"cannot create the lock file {path}: {exc.strerror}",
                           remedy="check that the install dir is writable") from exc


def _acquire(fd: int, path: Path, timeout: float, on_wait: WaitHook | None) -> None:
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if not announced and on_wait is not None:
            on_wait(holder_pid(path))
            announced = True
        if time.monotonic() >= deadline:
            pid = holder_pid(path)
            who = f"PID {pid}" if pid else "an unknown process"
            raise LockHeldError(
                f"another installer run ({who}) holds {path} after waiting {timeout:g}s")
        time.sleep(POLL_SECONDS)


def holder_pid(path: Path) -> int | None:
    """The PID the current holder wrote, if readable."""
    try:
        text = read_capped(path, 64).decode("utf-8", "replace").strip()  # regular files only
    except OSError:
        return None
    return int(text) if text.isdigit() else None
