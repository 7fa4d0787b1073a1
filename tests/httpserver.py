"""A real threaded HTTP/1.1 file server on 127.0.0.1 with Range, ETag and injected faults.

    with MirrorServer(root) as server:
        server.fault("/pkg/f.so", Fault("drop", after=4096, times=2))
        url = server.url + "/pkg/f.so"

Faults are consumed one request at a time per path (or path prefix when the key ends
with '/'): `drop` closes after N body bytes; `status` answers a code (503, 404, 403...);
`retry_after` answers 429 with a Retry-After header; `stall` sends N bytes then sleeps;
`corrupt` flips one byte (same length); `truncate` announces and sends only N bytes;
`change` serves other bytes under another ETag, then drops after N bytes (a file replaced
upstream between requests); `trickle` sends N bytes, then one byte every `seconds` (a
mirror that never trips a per-recv read timeout); `slow_headers` sends its status line and
headers one byte every `seconds`; `redirect` answers `status` (3xx) with `other` as the
Location; `serve` answers 200 with `other` as the body (a hostile or broken document).
A fault with `length=False` sends no Content-Length: the body ends when the connection
closes (what http.client then reads from a socket its connection object no longer holds).
Every request is recorded for assertions (with its query and Authorization header).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Fault:
    """One injected misbehaviour; `times` requests are affected (0: every request)."""

    kind: str
    after: int = 0
    times: int = 1
    status: int = 503
    retry_after: int = 1
    seconds: float = 5.0
    other: bytes = b""
    length: bool = True


@dataclass(frozen=True)
class Request:
    """What the server saw and answered."""

    path: str
    range: str | None
    if_range: str | None
    status: int
    query: str = ""
    authorization: str | None = None


def etag_of(path: Path) -> str:
    info = path.stat()
    return f'"{info.st_size:x}-{info.st_mtime_ns:x}"'


class _Server(ThreadingHTTPServer):
    """A client that hangs up mid-body (a killed install, a cut download) is what many tests
    do on purpose: its broken pipe is not printed; any other handler error still is."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLEOFError):
            super().handle_error(request, client_address)


class MirrorServer:
    """Serves `root` over HTTP on an ephemeral 127.0.0.1 port, in a background thread."""

    def __init__(self, root: Path, *, etags: bool = True,
                 tls: tuple[Path, Path] | None = None) -> None:
        self.root = root
        self.etags = etags
        self.faults: dict[str, list[Fault]] = {}
        self.requests: list[Request] = []
        self.proxied = 0
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"server_state": self})
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.scheme = "https" if tls else "http"
        if tls:  # (certificate, key): serve https with them
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> MirrorServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def fault(self, path: str, *faults: Fault) -> None:
        with self.lock:
            self.faults.setdefault(path, []).extend(faults)

    def take_fault(self, path: str) -> Fault | None:
        with self.lock:
            keys = [path] + [k for k in self.faults if k.endswith("/") and path.startswith(k)]
            for key in keys:
                queue = self.faults.get(key)
                if queue:
                    fault = queue[0]
                    if fault.times > 0:
                        fault.times -= 1
                        if fault.times == 0:
                            queue.pop(0)
                    return fault
        return None

    def record(self, request: Request) -> None:
        with self.lock:
            self.requests.append(request)

    def requests_for(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: MirrorServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _path(self) -> str:
        """The request path; an absolute-form target (what a client sends to a proxy) is
        served as its path, so this server can also stand in for a forward proxy."""
        target = self.path.split("?")[0]
        if target.startswith(("http://", "https://")):
            return "/" + target.split("://", 1)[1].partition("/")[2]
        return target

    def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
        self._record(status)
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _record(self, status: int) -> None:
        self.server_state.record(Request(self._path(), self.headers.get("Range"),
                                         self.headers.get("If-Range"), status,
                                         self.path.partition("?")[2],
                                         self.headers.get("Authorization")))

    def _serve(self, *, head: bool) -> None:
        state = self.server_state
        path = self._path()
        if self.path.startswith("http://"):
            with state.lock:
                state.proxied += 1
        fault = state.take_fault(path)
        if fault and fault.kind == "status":
            return self._answer(fault.status)
        if fault and fault.kind == "retry_after":
            return self._answer(429, {"Retry-After": str(fault.retry_after)})
        if fault and fault.kind == "redirect":
            return self._answer(fault.status, {"Location": fault.other.decode()})
        if fault and fault.kind == "slow_headers":
            return self._slow_headers(fault)
        target = (state.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(state.root.resolve()) or not target.is_file():
            return self._answer(404)
        if fault and fault.kind in ("change", "serve"):
            data, etag = fault.other, f'"changed-{hashlib.sha256(fault.other).hexdigest()[:8]}"'
        else:
            data, etag = None, etag_of(target)
        size = len(data) if data is not None else target.stat().st_size
        start, end, status = self._range(size, etag)
        if status == 416:
            return self._answer(416, {"Content-Range": f"bytes */{size}"})
        self._record(status)
        self.send_response(status)
        length = end - start
        if fault and fault.kind == "truncate":
            length = min(length, fault.after)
        if fault is None or fault.length:
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Accept-Ranges", "bytes")
        if state.etags:
            self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not head:
            self._body(target, data, start, length, fault)

    def _trickle(self, rest: bytes, seconds: float) -> None:
        _send_slowly(self, rest, seconds)

    def _slow_headers(self, fault: Fault) -> None:
        self._record(200)
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Slow: " + b"x" * 64 + b"\r\n\r\n{}"
        _send_slowly(self, head, fault.seconds)
        self.close_connection = True

    def _range(self, size: int, etag: str) -> tuple[int, int, int]:
        header = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        match = _RANGE_RE.match(header or "")
        if not match or (if_range is not None and if_range != etag):
            return 0, size, 200
        start = int(match.group(1))
        end = min(int(match.group(2)) + 1, size) if match.group(2) else size
        if start >= size or start >= end:
            return 0, 0, 416
        return start, end, 206

    def _body(self, target: Path, data: bytes | None, start: int, length: int,
              fault: Fault | None) -> None:
        kind = fault.kind if fault else None
        if data is None and kind is None:
            with target.open("rb") as handle:
                self.connection.sendfile(handle, start, length)
            return
        body = data if data is not None else _read_range(target, start, length)
        body = body[:length]
        if kind == "corrupt" and body:
            spot = min(fault.after if fault else 0, len(body) - 1)
            body = body[:spot] + bytes([body[spot] ^ 0xFF]) + body[spot + 1:]
        cut = (fault.after if kind in ("drop", "change", "stall", "trickle") and fault
               else len(body))
        self.wfile.write(body[:cut])
        self.wfile.flush()
        if kind == "stall" and fault:
            time.sleep(fault.seconds)
            self.wfile.write(body[cut:])
            return
        if kind == "trickle" and fault:
            self._trickle(body[cut:], fault.seconds)
            return
        if kind in ("drop", "change"):
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True


def _send_slowly(handler: BaseHTTPRequestHandler, data: bytes, seconds: float) -> None:
    """One byte every `seconds`, until done or the client hangs up."""
    try:
        for value in data:
            handler.wfile.write(bytes([value]))
            handler.wfile.flush()
            time.sleep(seconds)
    except OSError:
        handler.close_connection = True


def _read_range(path: Path, start: int, length: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(start)
        return handle.read(length)


def write_random(path: Path, size: int, seed: int = 0) -> str:
    """Write `size` pseudo-random bytes (fast, deterministic); return their sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    block = hashlib.sha256(str(seed).encode()).digest() * (1 << 15)  # 1 MiB
    digest = hashlib.sha256()
    with path.open("wb") as handle:
        written = 0
        counter = 0
        while written < size:
            chunk = (counter.to_bytes(8, "little") + block)[: min(len(block) + 8, size - written)]
            handle.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            counter += 1
    os.utime(path)
    return digest.hexdigest()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with openssl (the CA bundle is the cert)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@contextlib.contextmanager
def answering_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An API server that answers 200 (an empty Node) to everything and records each call
    (method, path, JSON body): for tests that look only at what the installer sent."""
    calls: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            calls.append({"method": self.command, "path": self.path,
                          "body": json.loads(body or b"{}")})
            reply = json.dumps({"kind": "Node", "metadata": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        do_GET = do_PATCH = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()
        server.server_close()
