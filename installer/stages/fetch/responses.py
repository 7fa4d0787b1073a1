"""HTTP answers and transfer helpers of the downloader: status codes, Retry-After, TLS
failures, network failures in our words, resume validators, and the hashing thread."""

from __future__ import annotations

import email.utils
import errno
import queue
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import requests
import urllib3

from installer.errors import DownloadError
from installer.stages.fetch.failures import NotOnMirror, ShortOnMirror, TlsError
from installer.stages.fetch.urls import safe, scrub

NETWORK_ERRORS = (requests.ConnectionError, requests.Timeout,
                   requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError,
                   ConnectionError, TimeoutError)


class Retryable(Exception):
    """A transient failure: another attempt may succeed (after `retry_after` if given)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class HashPipe:
    """Hashes chunks on a second thread while the first receives and writes the next ones.

    hashlib, recv and write all release the GIL, so on two cores the hash costs no wall
    time. Leaving the block waits until every queued chunk is hashed: the hash then covers
    exactly the bytes written, which a resume relies on.
    """

    def __init__(self, hasher: Any, depth: int = 8) -> None:
        self.hasher = hasher
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._run, name="sha256", daemon=True)

    def _run(self) -> None:
        while (chunk := self.queue.get()) is not None:
            self.hasher.update(chunk)

    def put(self, chunk: bytes) -> None:
        self.queue.put(chunk)

    def __enter__(self) -> HashPipe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.thread.join()


def check_status(response: requests.Response, url: str) -> None:
    status = response.status_code
    if status in (200, 206):
        return
    if status in (403, 404, 410):
        raise NotOnMirror(f"{safe(url)} answered {status}")
    if status == 429 or status == 408 or status >= 500:
        raise Retryable(f"HTTP {status}", retry_after(response.headers.get("Retry-After")))
    raise DownloadError(f"{safe(url)} answered HTTP {status}",
                        remedy="check the mirror URL and its access rules")


_UNSATISFIED_RE = re.compile(r"^bytes \*/(\d+)$")


def check_length(response: requests.Response, url: str, size: int | None, received: int
                 ) -> None:
    """A resume answered 416 short of the manifest's size: the mirror's file is shorter than
    its manifest lists, so the package on that mirror is inconsistent and the next mirror is
    tried. (A short 200 alone may be a dropped transfer: that one is resumed first.)"""
    if size is None or response.status_code != 416 or received >= size:
        return
    match = _UNSATISFIED_RE.match(response.headers.get("Content-Range", ""))
    total = int(match.group(1)) if match else received
    if total < size:
        raise ShortOnMirror(f"{safe(url)}: the mirror's file is {total} bytes, the manifest "
                            f"says {size}: the package on that mirror is inconsistent")


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds, from either of its two forms."""
    if not value:
        return None
    if value.strip().isascii() and value.strip().isdigit():
        return min(float(value.strip()), 1e9)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def validator(response: requests.Response) -> str | None:
    """A strong ETag, else Last-Modified: what If-Range may carry."""
    etag = response.headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("Last-Modified")


_TLS_REASON_RE = re.compile(r"certificate verify failed: ([^'\"()]+)|(hostname [^'\"()]+)")


def tls_error(url: str, exc: Exception) -> TlsError:
    """One line for a TLS failure: verification (with the reason) or another handshake error."""
    text = str(exc)
    match = _TLS_REASON_RE.search(text)
    if match or "CERTIFICATE_VERIFY_FAILED" in text:
        reason = (match.group(1) or match.group(2)).strip() if match else "untrusted certificate"
        return TlsError(f"TLS verification failed for mirror {safe(url)}: {reason}")
    return TlsError(scrub(f"TLS handshake with mirror {safe(url)} failed: {text[-300:]}", url))


def network_cause(exc: BaseException, url: str) -> str:
    """What failed, in our words: the name lookup, the connection (refused, unreachable,
    timed out), the proxy, or the answer breaking off; never the HTTP library's internals
    (connection pools, retry counters). Unknown failures keep their type and text."""
    parts = urllib.parse.urlsplit(url)
    where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    causes = list(_causes(exc))

    def found(*kinds: type[BaseException]) -> bool:
        return any(isinstance(cause, kinds) for cause in causes)

    unreachable = [c for c in causes if isinstance(c, OSError)
                   and c.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)]
    # the innermost, most telling causes first: urllib3 files a refused connection under
    # its connect-timeout class
    if found(socket.gaierror, urllib3.exceptions.NameResolutionError):
        return f"DNS: the name {parts.hostname} does not resolve (check the mirror's host " \
               "name and the node's DNS)"
    if found(requests.exceptions.ProxyError, urllib3.exceptions.ProxyError):
        return "proxy: the proxy in HTTPS_PROXY/HTTP_PROXY failed the connection"
    if found(ConnectionRefusedError):
        return f"connect: {where} refused the connection (nothing listens there)"
    if unreachable:
        return f"connect: no route to {where} ({unreachable[0].strerror})"
    if found(requests.exceptions.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError):
        return f"connect: no answer from {where} within the connect timeout"
    if found(requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError):
        return f"read: {where} sent nothing within the read timeout"
    if found(ConnectionResetError, requests.exceptions.ChunkedEncodingError,
             urllib3.exceptions.ProtocolError):
        return f"the connection to {where} broke off mid-answer (reset or closed)"
    return scrub(f"{type(exc).__name__}: {str(exc)[-300:]}", url)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it wraps (cause, context, urllib3's `reason`, exceptions in its args),
    outermost first, each once."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending and len(seen) < 16:
        cause = pending.pop(0)
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        inner = [cause.__cause__, cause.__context__, getattr(cause, "reason", None),
                 *cause.args]
        pending += [e for e in inner if isinstance(e, BaseException)]
