"""Download progress: a bar on a terminal, a JSON log event at most every few seconds otherwise."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO


class Progress:
    """Thread-safe byte counter that reports itself without flooding a DaemonSet's log."""

    def __init__(self, total: int, log: Any, *, stream: TextIO | None = None,
                 interval: float = 5.0, label: str = "download") -> None:
        self.total = total
        self.done = 0
        self.log = log
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.interval = interval if not self.tty else 0.2
        self.label = label
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._last = self._start

    def advance(self, count: int) -> None:
        """Add (or, after a restart, subtract) bytes; report when the interval has passed."""
        with self._lock:
            self.done += count
            now = time.monotonic()
            if now - self._last < self.interval:
                return
            self._last = now
            self._report(now)

    def _report(self, now: float) -> None:
        rate = self.done / max(now - self._start, 1e-6)
        percent = 100.0 * self.done / self.total if self.total else 100.0
        if self.tty:
            filled = int(percent / 100 * 30)
            self.stream.write(f"\r{self.label} [{'#' * filled}{' ' * (30 - filled)}] "
                              f"{percent:5.1f}% {self.done / 1e6:.0f}/{self.total / 1e6:.0f} MB "
                              f"{rate / 1e6:.0f} MB/s")
            self.stream.flush()
        else:
            self.log.info("download progress", bytes=self.done, total_bytes=self.total,
                          percent=round(percent, 1), mb_per_s=round(rate / 1e6, 1))

    def finish(self) -> None:
        """End the bar's line on a terminal."""
        if self.tty:
            with self._lock:
                self._report(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
