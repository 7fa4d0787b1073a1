"""The HTTP side: `/metrics` renders the latest snapshot (prometheus-client's text format),
`/healthz` says whether collections are current. A scrape never calls NVML or the kubelet.

A private registry with `describe()` (so registering never runs a collection), and a
collector whose `collect()` cannot raise: a rendering bug costs one group of families,
not the scrape.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from installer.agent.metrics.families import sections
from installer.agent.metrics.snapshot import Snapshot

STALE_INTERVALS = 3  # /healthz fails once no collection finished for this many intervals


class SnapshotCollector(Collector):
    """Yields the families of whatever snapshot `latest()` returns now."""

    def __init__(self, latest: Callable[[], Snapshot], log: Any) -> None:
        self.latest, self.log = latest, log

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing collected at registration

    def collect(self) -> Iterator[Metric]:
        for section in sections(self.latest(), time.time()):
            try:
                built = section()
            except Exception as exc:  # never fail the whole scrape
                self.log.error("metrics rendering failed", detail=repr(exc))
                continue
            yield from built


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck scraper never blocks the agent's exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return  # a scrape every 15 s is not news


def make_app(latest: Callable[[], Snapshot], interval_s: float, log: Any) -> Any:
    """The WSGI app: /metrics from the snapshot, /healthz from its age."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(latest, log))
    metrics = make_wsgi_app(registry)

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


def serve(address: str, port: int, app: Any) -> tuple[WSGIServer, threading.Thread]:
    """Bind and serve on a daemon thread; OSError if the port is taken."""
    server_class = _Server6 if ":" in address else _Server
    httpd = make_server(address, port, app, server_class, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
