"""The HTTP side: `/metrics` renders the latest snapshot (prometheus-client's formats, each
formatted once per collection: `exposition`), `/healthz` says whether collections are
current. A scrape never calls NVML or the kubelet.

A private registry with `describe()` (so registering never runs a collection), and a
collector whose `collect()` cannot raise: a rendering bug costs one group of families,
not the scrape.

Under load the server stays bounded: the listen backlog holds `LISTEN_BACKLOG` connections
(Python's default of 5 dropped SYNs, and clients retried for up to ~30 s), at most
`MAX_THREADS` connections are served at once (the next wait in the backlog, not in a new
thread), every read waits at most `READ_TIMEOUT_S` (an idle client is disconnected) and a
connection lives at most `CONNECTION_DEADLINE_S` (a client trickling one byte per read
timeout is cut off too). One request per connection (HTTP/1.0, as wsgiref serves).
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import structlog
from prometheus_client.core import Metric
from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import Collector

from installer.agent.metrics import dcgm
from installer.agent.metrics.exposition import cached_app
from installer.agent.metrics.families import sections
from installer.agent.metrics.snapshot import Snapshot

STALE_INTERVALS = 3  # /healthz fails once no collection finished for this many intervals
LISTEN_BACKLOG = 256  # connections the kernel queues while every thread is busy
MAX_THREADS = 16  # connections served at once
READ_TIMEOUT_S = 5.0  # the longest wait for a client's next bytes
CONNECTION_DEADLINE_S = 30.0  # the longest a connection is kept, however it trickles


class SnapshotCollector(Collector):
    """Yields the families of whatever snapshot `latest()` returns now."""

    def __init__(self, latest: Callable[[], Snapshot], log: Any, *,
                 dcgm_names: bool = False, part: str = "all") -> None:
        self.latest, self.log, self.dcgm_names, self.part = latest, log, dcgm_names, part

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing collected at registration

    def collect(self) -> Iterator[Metric]:
        for section in sections(self.latest(), time.time(), dcgm_names=self.dcgm_names,
                                part=self.part):
            try:
                built = section()
            except Exception as exc:  # never fail the whole scrape
                self.log.error("metrics rendering failed", detail=repr(exc))
                continue
            yield from built


class _Reaper:
    """Shuts down connections older than their deadline (one thread, one check a second):
    the read timeout bounds each wait, this bounds the whole connection."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._open: dict[int, tuple[float, socket.socket]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="metrics-reaper", daemon=True).start()

    def add(self, conn: socket.socket) -> None:
        with self._lock:
            self._open[id(conn)] = (time.monotonic() + self.limit_s, conn)

    def remove(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.pop(id(conn), None)

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.limit_s / 4)):
            now = time.monotonic()
            with self._lock:
                late = [conn for deadline, conn in self._open.values() if deadline <= now]
            for conn in late:  # wakes the handler's blocked read: it sees end-of-file
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self._stop.set()


class _Server(WSGIServer):
    """wsgiref's server with a deep backlog and a bounded set of handler threads."""

    request_queue_size = LISTEN_BACKLOG
    tls: ssl.SSLContext | None = None  # set: each connection's TLS handshake, on its thread
    handshake_timeout_s = READ_TIMEOUT_S

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler], *,
                 max_threads: int, deadline_s: float) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_threads)
        self._reaper = _Reaper(deadline_s)
        self._closing = threading.Event()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve on a thread once one of the slots is free (until then the accept loop
        waits and new connections queue in the kernel's backlog); a shutdown stops the
        wait, so the agent's exit never waits on busy slots."""
        while not self._slots.acquire(timeout=0.5):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        try:
            threading.Thread(target=self._work, args=(request, client_address),
                             name="metrics-conn", daemon=True).start()
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def _work(self, request: socket.socket, client_address: Any) -> None:
        conn = request
        self._reaper.add(conn)
        try:
            if self.tls is not None:  # the handshake bounded like a read, off the accept loop
                request.settimeout(self.handshake_timeout_s)
                conn = self.tls.wrap_socket(request, server_side=True)
                self._reaper.remove(request)
                self._reaper.add(conn)
            self.finish_request(conn, client_address)
        except Exception:
            self.handle_error(conn, client_address)
        finally:
            self._reaper.remove(conn)
            self.shutdown_request(conn)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is routine; anything else, one line."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            structlog.get_logger().warning("metrics request failed", detail=repr(error))

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()

    def server_close(self) -> None:
        self._reaper.stop()
        super().server_close()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S  # socketserver sets it on the connection: every read waits so long

    def log_message(self, format: str, *args: Any) -> None:
        return  # a scrape every 15 s is not news


def make_app(latest: Callable[[], Snapshot], interval_s: float, log: Any, *,
             dcgm_names: bool = False) -> Any:
    """The WSGI app: /metrics from the snapshot (with dcgm-exporter's family when
    `dcgm_names`), /healthz from its age."""
    metrics = cached_app(latest, lambda snapshot, part: SnapshotCollector(
        snapshot, log, dcgm_names=dcgm_names, part=part))
    if dcgm_names:
        metrics = _dcgm_counters(metrics)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            age = time.time() - latest().taken_at
            fresh = age <= STALE_INTERVALS * interval_s + 5
            start("200 OK" if fresh else "503 Service Unavailable",
                  [("Content-Type", "text/plain; charset=utf-8")])
            return [(f"ok: collected {age:.1f}s ago\n" if fresh else
                     f"stale: last collection {age:.0f}s ago\n").encode()]
        if path in ("/metrics", "/"):
            result: list[bytes] = metrics(environ, start)
            return result
        start("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics or /healthz\n"]

    return app


def _dcgm_counters(metrics: Any) -> Any:
    """prometheus-client's app, its text format's counter lines as dcgm-exporter writes
    them (`dcgm.text_headers`): rendered uncompressed, fixed, then gzipped if asked."""
    def app(environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        answer: list[Any] = []
        plain = {k: v for k, v in environ.items() if k != "HTTP_ACCEPT_ENCODING"}
        body = b"".join(metrics(plain, lambda status, headers, *_: answer.extend(
            (status, list(headers)))))
        status, headers = answer
        if dict(headers).get("Content-Type", "").startswith("text/plain"):
            body = dcgm.text_headers(body)
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        start(status, headers)
        return [body]

    return app


def serve(address: str, port: int, app: Any, *, read_timeout_s: float = READ_TIMEOUT_S,
          max_threads: int = MAX_THREADS, deadline_s: float = CONNECTION_DEADLINE_S,
          tls: ssl.SSLContext | None = None) -> tuple[WSGIServer, threading.Thread]:
    """Bind and serve on a daemon thread (HTTPS with `tls`); OSError if the port is taken.
    The limits are the module's (tests pass shorter ones)."""
    server_class = _Server6 if ":" in address else _Server
    handler = type("_Handler", (_Quiet,), {"timeout": read_timeout_s})
    httpd = server_class((address, port), handler, max_threads=max_threads,
                         deadline_s=deadline_s)
    httpd.tls, httpd.handshake_timeout_s = tls, read_timeout_s
    if tls is not None:
        httpd.base_environ["wsgi.url_scheme"] = "https"
    httpd.set_app(app)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
