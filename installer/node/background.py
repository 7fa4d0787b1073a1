"""A command run in the background, looked at without waiting: the agent starts it, then
polls it once per round, and kills it when it has run too long.

The child runs in its own session (its process group is its pid), so a kill reaches what it
started too (a compiler under `prepare`) and nothing else. Its stdout comes through a
non-blocking pipe drained at each poll, kept up to `limit` bytes and the rest read and
dropped (a child writing without end never blocks on a full pipe, nor fills memory);
stderr goes to a log file in the caller's work area, for the tail a failure quotes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class Finished:
    """How a background command ended: exit code (negative: killed by that signal),
    stdout (at most the limit), whether more was dropped, and whether it timed out."""

    returncode: int
    stdout: bytes
    truncated: bool
    timed_out: bool
    seconds: float


class Job:
    """One running command; `poll` never blocks."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], log_file: Path,
                 timeout_s: float, limit: int) -> None:
        self.argv, self.timeout_s, self.limit = tuple(argv), timeout_s, limit
        log_file.parent.mkdir(parents=True, exist_ok=True)
        # the agent's own work area; a link put where the log goes is not followed
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(log_file, flags, 0o644), "wb") as log:
            self.process = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                env=dict(env), start_new_session=True, close_fds=True)
        self.started = time.monotonic()
        assert self.process.stdout is not None
        self._out = self.process.stdout.fileno()
        os.set_blocking(self._out, False)
        self._buffer = bytearray()
        self._truncated = False
        self._timed_out = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> Finished | None:
        """None while it runs (its output drained); how it ended once it has. Past the
        timeout, or past the output limit, its process group is killed."""
        self._drain()
        code = self.process.poll()
        if code is None and (self._truncated or
                             time.monotonic() - self.started > self.timeout_s):
            self._timed_out = not self._truncated  # past the limit: nothing more to read
            self.kill()
            code = self.process.wait(timeout=5)
        if code is None:
            return None
        self._drain()
        self._close()
        return Finished(code, bytes(self._buffer), self._truncated, self._timed_out,
                        time.monotonic() - self.started)

    def kill(self) -> None:
        """SIGKILL its process group (its session: only what it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Kill it and reap it (the agent is stopping)."""
        if self.process.poll() is None:
            self.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        self._close()

    def _drain(self) -> None:
        if self.process.stdout is None or self.process.stdout.closed:
            return
        for _ in range(64):  # 4 MiB a poll at most; a writer without end is read next time
            try:
                chunk = os.read(self._out, READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                return
            if not chunk:
                return
            room = self.limit - len(self._buffer)
            self._buffer += chunk[:max(room, 0)]
            self._truncated = self._truncated or len(chunk) > room

    def _close(self) -> None:
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()


def start(argv: Sequence[str], *, env: Mapping[str, str], log_file: Path, timeout_s: float,
          limit: int) -> Job:
    """Start `argv`; OSError when it cannot be exec'd."""
    return Job(argv, env=env, log_file=log_file, timeout_s=timeout_s, limit=limit)


def tail(log_file: Path, size: int = 2048) -> str:
    """The end of a log file, for a failure's message ('' when unreadable)."""
    try:
        with open(log_file, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - size))
            return log.read(size).decode(errors="replace")
    except OSError:
        return ""
