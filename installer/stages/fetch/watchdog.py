"""Wall-clock bounds on HTTP transfers, which requests' own timeouts cannot give.

requests' read timeout applies to each recv(): a mirror that trickles one byte every few
seconds never trips it, in the headers or in the body. Every attempt is therefore watched:
a watchdog thread shuts down the attempt's socket when the run's download deadline passes,
or when the mirror delivered less than `STALL_BYTES` within one read-timeout window. The
blocked read then returns at once and the attempt reports which bound fired.

The socket is found through the connection classes of the session's pools (a mixin that
records, per thread, the connection the current attempt uses), so no private attribute of
requests or urllib3 is touched.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from requests.adapters import HTTPAdapter

STALL_BYTES = 64 * 1024
_current = threading.local()


class Watch:
    """One attempt's bounds: the run's deadline and a window that moves with progress."""

    def __init__(self, deadline_end: float, window: float) -> None:
        self.deadline_end = deadline_end
        self.window = window
        self.window_end = time.monotonic() + window
        self.pending = 0
        self.conn: Any = None
        self.fired: str | None = None  # "deadline" or "stall"

    def progress(self, count: int) -> None:
        """`count` more bytes arrived; each STALL_BYTES opens a fresh window."""
        self.pending += count
        if self.pending >= STALL_BYTES:
            self.pending = 0
            self.window_end = time.monotonic() + self.window

    def due(self) -> float:
        return min(self.deadline_end, self.window_end)

    def fire(self, now: float) -> None:
        self.fired = "deadline" if now >= self.deadline_end else "stall"
        sock = getattr(self.conn, "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # the base class: an SSLSocket keeps its state
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Watchdog:
    """One thread per downloader that fires the watches whose bound has passed."""

    def __init__(self) -> None:
        self._watches: set[Watch] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def watch(self, deadline_end: float, window: float) -> Iterator[Watch]:
        """Bound the attempt made in this block (on this thread)."""
        watch = Watch(deadline_end, window)
        with self._cond:
            self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="download-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        previous = getattr(_current, "watch", None)
        _current.watch = watch
        try:
            yield watch
        finally:
            _current.watch = previous
            with self._cond:
                self._watches.discard(watch)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for watch in list(self._watches):
                    if watch.fired is None and now >= watch.due():
                        watch.fire(now)
                pending = [w.due() for w in self._watches if w.fired is None]
                self._cond.wait(timeout=max(0.01, min(pending) - now) if pending else None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


def _enlist(conn: Any) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.conn = conn


class _Enlisting:
    """Mixin for urllib3 connection classes: the current attempt learns its connection."""

    def connect(self) -> None:
        _enlist(self)
        super().connect()  # type: ignore[misc]

    def request(self, *args: Any, **kwargs: Any) -> Any:
        _enlist(self)
        return super().request(*args, **kwargs)  # type: ignore[misc]


@functools.cache
def _watched_pool(pool_cls: type[Any]) -> type[Any]:
    if getattr(pool_cls, "_gni_watched", False):
        return pool_cls
    conn_cls = pool_cls.ConnectionCls
    watched_conn = type(f"Watched{conn_cls.__name__}", (_Enlisting, conn_cls), {})
    return type(f"Watched{pool_cls.__name__}", (pool_cls,),
                {"ConnectionCls": watched_conn, "_gni_watched": True})


def _hook(manager: Any) -> Any:
    manager.pool_classes_by_scheme = {scheme: _watched_pool(cls) for scheme, cls
                                      in manager.pool_classes_by_scheme.items()}
    return manager


class WatchedAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections (direct or through a proxy) can be watched."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _hook(self.poolmanager)

    def proxy_manager_for(self, proxy: Any, **kwargs: Any) -> Any:
        return _hook(super().proxy_manager_for(proxy, **kwargs))
