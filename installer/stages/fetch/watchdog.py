"""Wall-clock bounds on HTTP transfers, which requests' own timeouts cannot give.

requests' read timeout applies to each recv(): a mirror that trickles one byte every few
seconds never trips it, in the headers or in the body; and nothing bounds the name lookup
(getaddrinfo blocks as long as the resolver is silent) or a TLS handshake fed byte by byte.
Every attempt is therefore watched, from its connection to its last byte:

- the connection (name lookup, TCP, proxy tunnel, TLS handshake) is made on a helper
  thread, and the attempt waits for it only until `--connect-timeout` or the run's
  download deadline, whichever is first;
- the transfer's socket is shut down by a watchdog thread when the deadline passes, or
  when the mirror delivered less than `STALL_BYTES` within one read-timeout window. The
  blocked read then returns at once and the attempt reports which bound fired;
- on SIGTERM/SIGINT (`installer.node.interrupts`) every watch fires at once, and every wait
  (a connection, a retry's back-off) ends.

The socket is recorded when the attempt connects or sends its request, through the
connection classes of the session's pools (a mixin), so no private attribute of requests or
urllib3 is touched; it is kept from then on, because http.client drops the connection's
reference once a response that ends with the connection (no Content-Length) begins.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from requests.adapters import HTTPAdapter

STALL_BYTES = 64 * 1024
_current = threading.local()


class Watch:
    """One attempt's bounds: the run's deadline and a window that moves with progress
    (`connect_window` long while connecting, `window` long per STALL_BYTES after)."""

    def __init__(self, deadline_end: float, window: float, connect_window: float) -> None:
        self.deadline_end = deadline_end
        self.window = window
        self.connect_window = connect_window
        self.window_end = time.monotonic() + window
        self.pending = 0
        self.sock: socket.socket | None = None
        self.connecting = False
        self.fired: str | None = None  # "deadline", "stall", "connect" or "interrupted"
        self.fired_connecting = False

    def progress(self, count: int) -> None:
        """`count` more bytes arrived; each STALL_BYTES opens a fresh window."""
        self.pending += count
        if self.pending >= STALL_BYTES:
            self.pending = 0
            self.window_end = time.monotonic() + self.window

    def due(self) -> float:
        return min(self.deadline_end, self.window_end)

    def fire(self, now: float, reason: str | None = None) -> None:
        self.fired_connecting = self.connecting
        self.fired = reason or ("deadline" if now >= self.deadline_end
                                else "connect" if self.connecting else "stall")
        sock = self.sock
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # the base class: an SSLSocket keeps its state
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Watchdog:
    """One thread per downloader that fires the watches whose bound has passed.

    One condition (over an RLock, so that `abort` may run in a signal handler on a thread
    that holds it) guards the watches and wakes every waiter: the watchdog thread, the
    attempts waiting for their connection, the retries waiting out a back-off.
    """

    def __init__(self) -> None:
        self._watches: set[Watch] = set()
        self._cond = threading.Condition(threading.RLock())
        self._thread: threading.Thread | None = None
        self._closed = False
        self.aborted = False

    @contextlib.contextmanager
    def watch(self, deadline_end: float, window: float, connect_window: float
              ) -> Iterator[Watch]:
        """Bound the attempt made in this block (on this thread)."""
        watch = Watch(deadline_end, window, connect_window)
        with self._cond:
            self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="download-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        previous = getattr(_current, "watch", None)
        _current.watch = (self, watch)
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
                fired = False
                for watch in list(self._watches):
                    if watch.fired is None and (self.aborted or now >= watch.due()):
                        watch.fire(now, "interrupted" if self.aborted else None)
                        fired = True
                if fired:
                    self._cond.notify_all()
                pending = [w.due() for w in self._watches if w.fired is None]
                self._cond.wait(timeout=max(0.01, min(pending) - now) if pending else None)

    def connect(self, watch: Watch, connect: Callable[[], None],
                close: Callable[[], None]) -> None:
        """Run `connect` on a helper thread; wait for it only while `watch` has not fired.

        A connection given up on is closed by its helper whenever it completes."""
        outcome: dict[str, BaseException | bool] = {}

        def helper() -> None:
            try:
                connect()
            except BaseException as exc:  # handed to the attempt, raised there
                outcome["error"] = exc
            with self._cond:
                outcome["done"] = True
                if outcome.get("abandoned"):
                    with contextlib.suppress(Exception):
                        close()
                self._cond.notify_all()

        with self._cond:
            watch.connecting = True
            watch.window_end = time.monotonic() + watch.connect_window
            self._cond.notify_all()
        threading.Thread(target=helper, name="download-connect", daemon=True).start()
        with self._cond:
            try:
                self._cond.wait_for(lambda: "done" in outcome or watch.fired is not None
                                    or self._closed)
            finally:
                if "done" not in outcome:
                    outcome["abandoned"] = True
            watch.connecting = False
            if "done" not in outcome:
                raise TimeoutError(f"connection given up ({watch.fired})")
            watch.window_end = time.monotonic() + watch.window
            self._cond.notify_all()
        error = outcome.get("error")
        if isinstance(error, BaseException):
            raise error

    def pause(self, seconds: float) -> None:
        """Sleep (a retry's back-off), ending early when the run is interrupted."""
        with self._cond:
            self._cond.wait_for(lambda: self.aborted or self._closed, timeout=seconds)

    def abort(self) -> None:
        """Fire every watch, now and from now on (signal-safe: flag and wake only)."""
        with self._cond:
            self.aborted = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _watched() -> tuple[Watchdog, Watch] | None:
    current: tuple[Watchdog, Watch] | None = getattr(_current, "watch", None)
    return current


class _Enlisting:
    """Mixin for urllib3 connection classes: the current attempt's watch bounds the
    connection and learns its socket."""

    sock: Any
    close: Callable[[], None]

    def connect(self) -> None:
        current = _watched()
        if current is None:
            super().connect()  # type: ignore[misc]
            return
        dog, watch = current
        dog.connect(watch, super().connect, self.close)  # type: ignore[misc]
        watch.sock = self.sock

    def request(self, *args: Any, **kwargs: Any) -> Any:
        current = _watched()
        if current is not None and self.sock is not None:
            current[1].sock = self.sock  # a kept-alive connection, already open
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
