"""The agent's API writes, off its readiness loop: a bounded queue with one worker thread.

Readiness on the node (the files, the probe's view) changes within the round that decides
it; what the cluster is told (the condition, the status label, Events) is put here and the
round goes on. Each write has a key: a write put while an earlier one of the same key is
still queued replaces it (the condition and the label coalesce to the latest verdict; an
Event is its own key). A failed write stays queued, unless replaced, and is tried again
after a capped exponential backoff, behind what was queued meanwhile; an Event is given
up after `EVENT_TRIES`. The queue holds at most `MAX_EVENTS` Events (the oldest dropped
first), so a hung API server costs memory no more than it costs time: nothing in the loop
ever waits on it.

A write that got no answer may still land later: a server that was hung can apply it after
a newer write of the same key went through, and the Node then shows a stale verdict that
nothing would correct, since only changes are sent. So, as node-problem-detector's condition
manager resyncs after a failed sync (kubernetes/node-problem-detector
pkg/exporters/k8sexporter/condition/manager.go at 2cbf6c50, `resyncPeriod`), once a write
has gone unanswered the latest write of every state key (not Events) is sent again
`RESYNC_S` after the server answers again.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
MAX_EVENTS = 32
EVENT_TRIES = 3
EVENT_PREFIX = "event:"
RESYNC_S = 10.0  # node-problem-detector's resyncPeriod


@dataclass
class _Write:
    what: str
    call: Callable[[], object]
    tries: int = 0


class ApiQueue:
    """Latest write per key, sent in the order the keys were first queued."""

    def __init__(self, log: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.clock = log, clock
        self._pending: dict[str, _Write] = {}
        self._lock = threading.Condition()
        self._busy = False
        self._closed = False
        self._retry_at = 0.0
        self._failures = 0
        self._ids = itertools.count()
        self._latest: dict[str, _Write] = {}  # the last write put per state key
        self._doubt = False  # a write went unanswered: a copy of it may land later
        self._resync_at: float | None = None
        self._thread: threading.Thread | None = None

    def put(self, key: str, what: str, call: Callable[[], object]) -> None:
        """Queue `call` under `key`, replacing a queued write of that key (never waits)."""
        with self._lock:
            self._pending[key] = _Write(what, call)
            if not key.startswith(EVENT_PREFIX):
                self._latest[key] = self._pending[key]
            self._start()
            self._lock.notify_all()

    def event(self, what: str, call: Callable[[], object]) -> None:
        """Queue one Event (its own key); past MAX_EVENTS the oldest queued is dropped."""
        with self._lock:
            events = [k for k in self._pending if k.startswith(EVENT_PREFIX)]
            for key in events[:max(0, len(events) - MAX_EVENTS + 1)]:
                self.log.warning("Event dropped: the API server is not answering",
                                 what=self._pending.pop(key).what)
        self.put(f"{EVENT_PREFIX}{next(self._ids)}", what, call)

    def pending(self) -> list[str]:
        """The keys still to be written (the one being written included)."""
        with self._lock:
            return list(self._pending) + (["(in flight)"] if self._busy else [])

    def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the queue to empty (a stopping agent's last words);
        True when it did. Backoff is skipped: this is the last chance."""
        end = self.clock() + timeout_s
        with self._lock:
            self._retry_at = 0.0
            self._lock.notify_all()
            while self._pending or self._busy:
                left = end - self.clock()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float) -> bool:
        """Drain for at most `timeout_s`, then stop the worker (what is left is dropped)."""
        drained = self.drain(timeout_s)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        return drained

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._work, name="api-writes",
                                            daemon=True)
            self._thread.start()

    def _next(self) -> tuple[str, _Write] | None:
        """The oldest queued write once any backoff has passed; None when closed."""
        with self._lock:
            while not self._closed:
                wait = self._retry_at - self.clock()
                if self._pending and wait <= 0:
                    key = next(iter(self._pending))
                    self._busy = True
                    return key, self._pending.pop(key)
                if not self._pending and self._resync_at is not None:
                    wait = self._resync_at - self.clock()
                    if wait <= 0:
                        self._resync()
                        continue
                self._lock.wait(wait if self._pending or self._resync_at is not None
                                else None)
            return None

    def _resync(self) -> None:
        """Queue the latest write of every state key again (the lock is held)."""
        self._doubt, self._resync_at = False, None
        for key, write in self._latest.items():
            self._pending.setdefault(key, _Write(write.what, write.call))
        self.log.info("writing the node's state again: a write went unanswered and may "
                      "have landed late", keys=list(self._latest))

    def _work(self) -> None:
        while (item := self._next()) is not None:
            key, write = item
            try:
                write.call()
            except Exception as exc:  # any failure of a courtesy write is a warning
                self._failed(key, write, exc)
            else:
                with self._lock:
                    self._failures, self._busy = 0, False
                    if self._doubt and self._resync_at is None:  # answering again
                        self._resync_at = self.clock() + RESYNC_S
                    self._lock.notify_all()

    def _failed(self, key: str, write: _Write, exc: Exception) -> None:
        with self._lock:
            self._busy = False
            # unanswered (no HTTP status: a timeout, a reset) may yet land; a refusal not
            self._doubt = self._doubt or getattr(exc, "status", None) is None
            self._failures += 1
            delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (self._failures - 1))
            self._retry_at = self.clock() + delay
            write.tries += 1
            retry = key not in self._pending and not (
                key.startswith(EVENT_PREFIX) and write.tries >= EVENT_TRIES)
            if retry:  # at the back: one the server keeps refusing never holds the others
                self._pending[key] = write
            self._lock.notify_all()
        self.log.warning(f"could not {write.what}", detail=str(exc)[:300],
                         retry_in_s=round(delay, 1) if retry else None)
