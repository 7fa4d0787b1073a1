"""What stands between a client and the fake API server (tests/kubefake.py), as faults a
test injects: a forward proxy that records every connection, and a front that accepts
connections and reads requests but never answers while it is told to hang."""

from __future__ import annotations

import select
import socket
import threading
import time
from contextlib import suppress
from socketserver import BaseRequestHandler, ThreadingTCPServer
from urllib.parse import urlsplit

# --- A forward proxy that records what went through it --------------------------------
# Enough of an HTTP proxy for the client: CONNECT host:port (answered 200, then bytes are
# relayed both ways, as squid does for https) and absolute-form requests (rewritten to
# origin form and relayed). Every connection's request line is recorded; targets other
# than 127.0.0.1 are refused with 403, as squid's access rules refuse, so nothing leaves
# the machine.


class Proxy:
    """`with Proxy() as proxy:` ... `proxy.url`, `proxy.seen` (request lines, in order)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        self.server = ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Proxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(10)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        self.seen.append(line)
        method, target, _ = [*line.split(" "), "", ""][:3]
        host, port, rest = _proxy_target(method, target, head)
        if host != "127.0.0.1":
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        with socket.create_connection((host, port), timeout=10) as upstream:
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(rest)
            _relay(client, upstream)


def _proxy_target(method: str, target: str, head: bytes) -> tuple[str, int, bytes]:
    """Where to connect, and (absolute form) the request rewritten to origin form."""
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        return host.strip("[]"), int(port), b""
    split = urlsplit(target)
    path = split.path + (f"?{split.query}" if split.query else "")
    first, _, others = head.partition(b"\r\n")
    rewritten = first.replace(target.encode("latin-1"), path.encode("latin-1"), 1)
    return split.hostname or "", split.port or 80, rewritten + b"\r\n" + others


def _relay(one: socket.socket, other: socket.socket) -> None:
    """Copy bytes both ways until either side closes (or 10 s of silence)."""
    while True:
        ready, _, _ = select.select([one, other], [], [], 10)
        if not ready:
            return
        for source in ready:
            data = source.recv(65536)
            if not data:
                return
            (other if source is one else one).sendall(data)


class HangingFront:
    """A real socket on 127.0.0.1 in front of the fake API: it forwards, or, while `hung`
    is set, accepts connections and reads requests but never answers them."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.hung = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):
            while True:
                client, _ = self.server.accept()
                upstream = socket.create_connection(self.upstream)
                self.open += [client, upstream]
                threading.Thread(target=self._pump, args=(client, upstream, True),
                                 daemon=True).start()
                threading.Thread(target=self._pump, args=(upstream, client, False),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, request: bool) -> None:
        with suppress(OSError):
            while data := source.recv(65536):
                while request and self.hung.is_set():  # held: never answered while hung
                    time.sleep(0.05)
                target.sendall(data)
        with suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()
        for sock in self.open:
            with suppress(OSError):
                sock.close()
