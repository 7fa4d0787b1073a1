"""HTTP/1.1 to the Kubernetes API server on the standard library, each call within a deadline.

A per-read timeout does not bound a call: an answer trickled one byte at a time never
trips it. Here every socket operation (connect, TLS handshake, send, each read) is given
only the time left before the call's deadline, so the whole exchange ends by then. The
answer's size is bounded while it is read, and its JSON is decoded within bounds (depth,
numbers, no NaN). One connection per call (`Connection: close`), as the callers make few
calls. The server's CA is the service account's `ca.crt` (else the system's); no proxy is
used unless one is given (`--kube-api-proxy`): `HTTPS_PROXY` is meant for the mirrors.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import re
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

MAX_ANSWER_BYTES = 32 << 20  # one page of the biggest list the installer reads, with room
MAX_DEPTH = 32  # a pod's managedFields nest about 13 deep
MAX_NUMBER_CHARS = 32
SHOWN = 120  # characters of a bad answer a message shows
# A JSON string, or an unterminated one up to the end (possessive: linear on any input).
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_REQUEST_PATH = re.compile(r"/[\x21-\x7e]*")  # printable ASCII, no space: one request line


class KubeError(Exception):
    """An API call failed (`status`: the HTTP status, None when no answer came; `causes`:
    the reasons the answer's Status gave, its own and its details' causes, such as
    `Forbidden` and `NamespaceTerminating`; `retry_after`: the answer's Retry-After, in
    seconds)."""

    def __init__(self, message: str, status: int | None = None,
                 causes: tuple[str, ...] = (), retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.causes = causes
        self.retry_after = retry_after


class Late(KubeError):
    """The call's deadline passed before a complete answer came (`bound`: the name of the
    caller's bound that set that deadline, e.g. UPGRADE_TIMEOUT; "" for the call's own)."""

    def __init__(self, message: str, bound: str = "") -> None:
        super().__init__(message)
        self.bound = bound


class Malformed(KubeError):
    """A 2xx answer that is not what the call returns (not JSON, not an object, a list
    without a list of items)."""


@dataclass(frozen=True)
class Answer:
    """A complete answer: its status, Retry-After (seconds, if any) and body."""

    status: int
    retry_after: float | None
    body: bytes


@dataclass(frozen=True)
class Target:
    """Where a connection goes: scheme, host (no brackets), port, and the URL's path."""

    scheme: str
    host: str
    port: int
    path: str = ""
    credentials: str | None = None  # user:password of a proxy URL, decoded

    @property
    def authority(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def target(url: str) -> Target:
    """Parse an API server or proxy URL (validated by the config already)."""
    split = urlsplit(url)
    scheme = split.scheme.lower()
    if scheme not in ("http", "https") or not split.hostname:
        raise KubeError(f"not an http:// or https:// URL: {url[:SHOWN]!r}")
    try:
        port = split.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise KubeError(f"a URL with a bad port: {url[:SHOWN]!r}") from None
    credentials = (f"{unquote(split.username)}:{unquote(split.password or '')}"
                   if split.username is not None else None)
    return Target(scheme, split.hostname, port, split.path.rstrip("/"), credentials)


class _Clock:
    """The time left before the deadline; Late once it has passed."""

    def __init__(self, deadline: float, budget: float) -> None:
        self.deadline = deadline
        self.budget = budget

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Late(f"no complete answer within {self.budget:.1f} s")
        return left


class _Reader(io.RawIOBase):
    """Socket reads, each given only the time left (what http.client reads through)."""

    def __init__(self, sock: socket.socket, clock: _Clock) -> None:
        self.sock = sock
        self.clock = clock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.sock.settimeout(self.clock.left())
        return self.sock.recv_into(buffer)


class _Source:
    """What `http.client.HTTPResponse` reads from: a socket's `makefile('rb')`."""

    def __init__(self, sock: socket.socket, clock: _Clock) -> None:
        self.file: Any = io.BufferedReader(_Reader(sock, clock))

    def makefile(self, *_: object, **__: object) -> Any:
        return self.file


def exchange(server: Target, proxy: Target | None, ca_file: Path | None, method: str,
             path: str, head: bytes, body: bytes, *, deadline: float) -> Answer:
    """Send one request (`head`: its header lines and the blank line) and read the whole
    answer by `deadline` (a time.monotonic() value); KubeError (Late) otherwise."""
    if not _REQUEST_PATH.fullmatch(path):
        raise KubeError(f"a path a request line cannot hold: {path[:SHOWN]!r}")
    clock = _Clock(deadline, max(0.0, deadline - time.monotonic()))
    try:
        sock = _open(server, proxy, ca_file, clock)
    except (OSError, http.client.HTTPException) as exc:
        _transport(exc, clock, "connect")
    try:
        via = proxy is not None and server.scheme == "http"  # absolute form to the proxy
        line = f"{method} {server.scheme}://{server.authority}{path}" if via else \
            f"{method} {path}"
        sock.settimeout(clock.left())
        sock.sendall(f"{line} HTTP/1.1\r\n".encode("ascii") + head + body)
        response = http.client.HTTPResponse(_Source(sock, clock),  # type: ignore[arg-type]
                                            method=method)
        response.begin()
        data = _body(response)
        return Answer(response.status, _retry_after(response.getheader("Retry-After")), data)
    except (OSError, http.client.HTTPException) as exc:
        _transport(exc, clock, "read the answer")
    finally:
        sock.close()


def _body(response: http.client.HTTPResponse) -> bytes:
    """The whole body (chunked, sized or to the close), in pieces, refused past the bound."""
    chunks: list[bytes] = []
    total = 0
    while chunk := response.read(64 << 10):
        total += len(chunk)
        if total > MAX_ANSWER_BYTES:
            raise KubeError(f"an answer of more than {MAX_ANSWER_BYTES >> 20} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


def _transport(exc: Exception, clock: _Clock, step: str) -> NoReturn:
    """A socket or HTTP failure as a KubeError; a timeout is the deadline passing."""
    if isinstance(exc, TimeoutError | socket.timeout) or clock.deadline <= time.monotonic():
        raise Late(f"no complete answer within {clock.budget:.1f} s") from exc
    detail = str(exc) or repr(exc)
    kind = ("SSLError" if isinstance(exc, ssl.SSLError) else "ConnectionError"
            if isinstance(exc, OSError) else type(exc).__name__)  # what requests named them
    raise KubeError(f"{kind}: cannot {step}: {type(exc).__name__}: {detail[:200]}") from exc


def _open(server: Target, proxy: Target | None, ca_file: Path | None,
          clock: _Clock) -> socket.socket:
    """A connected socket to the server (through the proxy's CONNECT for https), TLS done."""
    first = proxy or server
    sock = socket.create_connection((first.host, first.port), timeout=clock.left())
    try:
        if proxy is not None and server.scheme == "https":
            _tunnel(sock, server, proxy, clock)
        if server.scheme == "https":
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            sock.settimeout(clock.left())  # the whole handshake, not each of its reads
            return context.wrap_socket(sock, server_hostname=server.host)
    except BaseException:
        sock.close()
        raise
    return sock


def _tunnel(sock: socket.socket, server: Target, proxy: Target, clock: _Clock) -> None:
    """CONNECT through an HTTP proxy, its answer read within the deadline."""
    lines = [f"CONNECT {server.authority} HTTP/1.1", f"Host: {server.authority}"]
    lines += proxy_authorization(proxy)
    sock.settimeout(clock.left())
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    response = http.client.HTTPResponse(_Source(sock, clock),  # type: ignore[arg-type]
                                        method="CONNECT")
    response.begin()
    if response.status != 200:
        raise KubeError(f"the proxy {proxy.authority} refused to connect to "
                        f"{server.authority}: HTTP {response.status}", response.status)


def proxy_authorization(proxy: Target | None) -> list[str]:
    """The Proxy-Authorization header line for a proxy URL with user:password, if any."""
    if proxy is None or proxy.credentials is None:
        return []
    token = base64.b64encode(proxy.credentials.encode("utf-8")).decode("ascii")
    return [f"Proxy-Authorization: Basic {token}"]


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta form; an HTTP date is ignored)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(min(int(value.strip()), 3600))


def decode(body: bytes, what: str) -> dict[str, Any]:
    """A 2xx answer's JSON object, or KubeError naming the answer (a bounded prefix)."""
    problem = _problem(body)
    if problem is None:
        try:
            document = json.loads(body.decode("utf-8"), parse_int=_int,
                                  parse_constant=_constant)
        except (ValueError, RecursionError) as exc:
            problem = f"not JSON ({str(exc)[:80]})"
        else:
            if isinstance(document, dict):
                return document
            problem = f"a JSON {type(document).__name__}, not an object"
    raise Malformed(f"{what}: the answer is {problem}: {shown(body)}")


def _problem(body: bytes) -> str | None:
    """Why the body is not worth decoding (empty, not UTF-8, nested too deep), or None."""
    if not body.strip():
        return "empty"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8"
    shape = _NOT_BRACKET.sub("", _STRING.sub("", text)).translate(str.maketrans("{}", "[]"))
    for _ in range(MAX_DEPTH + 1):
        reduced = shape.replace("[]", "")
        if reduced == shape:
            return None  # balanced and shallow enough, or unbalanced: json says so
        shape = reduced
    return f"nested deeper than {MAX_DEPTH} levels"


def _int(digits: str) -> int:
    if len(digits) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(digits)} digits")
    return int(digits)


def _constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def shown(body: bytes) -> str:
    """The start of an answer as printable ASCII, for one-line messages."""
    text = body[:SHOWN].decode("utf-8", "replace")
    return ascii(text) + ("..." if len(body) > SHOWN else "")
