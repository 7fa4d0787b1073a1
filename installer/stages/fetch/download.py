"""HTTP(S) and file:// downloads: stream to a temp file while hashing, resume, retry, deadline.

With its helpers (`responses`, `watchdog`), the only module that imports `requests`
(start-up time matters: `import installer.cli` must stay light). A download is one pass:
each chunk is hashed and written as it arrives; after a drop the next attempt asks for the
rest with `Range` and `If-Range` (the ETag, else the Last-Modified date), and a server that
answers 200 instead makes it start over, never splice. Retries (tenacity) cover connection
errors, timeouts, 408, 429 (honouring Retry-After) and 5xx, bounded by attempts and by one
deadline for the whole run; the watchdog makes that deadline, and a minimum rate per
read-timeout window, hold against a mirror that trickles or a connection that never comes,
and cuts every transfer on SIGTERM/SIGINT. No message carries a URL's credentials or query.
"""

from __future__ import annotations

import hashlib
import re
import signal
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
import tenacity

from installer.errors import ConfigError, DownloadError, IntegrityError
from installer.node import interrupts
from installer.stages.fetch.failures import (
    ChecksumMismatch,
    DeadlineExpired,
    NotOnMirror,
    RetryAfterBeyondDeadline,
)
from installer.stages.fetch.local import file_url, local_path, open_local, read_local
from installer.stages.fetch.progress import Progress
from installer.stages.fetch.responses import (
    NETWORK_ERRORS,
    HashPipe,
    Retryable,
    check_length,
    check_status,
    network_cause,
    tls_error,
    validator,
)
from installer.stages.fetch.urls import safe, scrub
from installer.stages.fetch.watchdog import STALL_BYTES, Watch, Watchdog, WatchedAdapter

__all__ = [
    "ChecksumMismatch",
    "DownloadSettings",
    "Downloader",
    "NotOnMirror",
    "file_url",
    "local_path",
]

T = TypeVar("T")
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")



@dataclass(frozen=True)
class DownloadSettings:
    """Timeouts, retries and transport options (built from Config by the fetch stage)."""

    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    deadline: float = 1800.0
    attempts: int = 6
    parallel: int = 4
    ca_bundle: Path | None = None
    allow_http: bool = False
    chunk_size: int = 1024 * 1024
    backoff_initial: float = 0.2
    backoff_max: float = 10.0
    retry_after_max: float = 120.0


@dataclass
class _Partial:
    """A download in progress: bytes on disk so far, their running hash, the validator."""

    path: Path
    size: int | None
    new_hasher: Callable[[], Any] = hashlib.sha256
    limit: int | None = None  # when the size is not known in advance
    hasher: Any = None
    received: int = 0
    validator: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    resumes: int = 0
    restarts: int = 0

    def reset(self) -> None:
        self.hasher = self.new_hasher()
        self.received = 0
        self.validator = None
        with self.path.open("wb"):
            pass


class Deadline:
    """One deadline for every download of a run."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.end - time.monotonic()


class Downloader:
    """Downloads files and small documents from mirrors; thread-safe for parallel files."""

    def __init__(self, settings: DownloadSettings, log: Any,
                 progress: Progress | None = None) -> None:
        if settings.ca_bundle is not None and not settings.ca_bundle.is_file():
            raise ConfigError(f"--ca-bundle {settings.ca_bundle} is not a file",
                              remedy="mount the CA bundle (PEM) into the container")
        self.settings = settings
        self.log = log
        self.progress = progress
        self.deadline = Deadline(settings.deadline)
        self.watchdog = Watchdog()
        self._unhook = interrupts.register(self.watchdog.abort)
        self.session = requests.Session()
        # passed on each request: a session-level value loses to REQUESTS_CA_BUNDLE (requests)
        self.verify: str | bool = str(settings.ca_bundle) if settings.ca_bundle else True
        adapter = WatchedAdapter(pool_maxsize=max(4, settings.parallel))
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)

    # ------------------------------------------------------------ public

    def fetch_bytes(self, url: str, limit: int,
                    oversize: type[IntegrityError] = IntegrityError) -> bytes:
        """A small document (index.json, manifest.json), at most `limit` bytes; a larger one
        raises `oversize` (its class carries the document's own remedy)."""
        if url.startswith("file://"):
            return read_local(url, limit, oversize)
        return self._retry(url, lambda watch: self._get_small(url, limit, watch, oversize))

    def fetch_file(self, url: str, dest: Path, *, size: int, sha256: str) -> None:
        """Download `url` into `dest` and check size and sha256 (ChecksumMismatch if not)."""
        partial = _Partial(dest, size)
        partial.reset()
        if url.startswith("file://"):
            self._copy_local(url, partial)
        else:
            self._retry(url, lambda watch: self._attempt(url, partial, watch))
        self._check(url, partial, sha256)

    def fetch_object(self, url: str, dest: Path, *, limit: int, hasher: Callable[[], Any]
                     ) -> tuple[Any, Mapping[str, str]]:
        """A file whose digest is not known in advance (COS artifacts): streamed through
        `hasher`, resumed and retried like any file; returns the hasher and the response
        headers for the caller to check (`packages.cos.gcshash`)."""
        partial = _Partial(dest, None, hasher, limit)
        partial.reset()
        self._retry(url, lambda watch: self._attempt(url, partial, watch))
        return partial.hasher, partial.headers

    def close(self) -> None:
        self._unhook()
        self.watchdog.close()
        self.session.close()

    # ------------------------------------------------------------ retries

    def _retry(self, url: str, attempt: Callable[[Watch], T]) -> T:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Retryable),
            stop=tenacity.stop_after_attempt(self.settings.attempts)
            | tenacity.stop_when_event_set(_Expired(self.deadline)),  # type: ignore[arg-type]
            wait=self._wait, sleep=self.watchdog.pause, before_sleep=self._log_retry(url),
            reraise=True)
        try:
            return retrying(lambda: self._watched(url, attempt))
        except Retryable as exc:
            if self.deadline.remaining() <= 0:
                raise self._expired(url, f"last error: {exc}") from None
            raise DownloadError(f"GET {safe(url)} failed after retries: {exc}") from None

    def _watched(self, url: str, attempt: Callable[[Watch], T]) -> T:
        """One attempt under the watchdog; a fired bound replaces whatever the read saw."""
        interrupts.raise_if_received()  # a worker's next file or retry after a signal
        with self.watchdog.watch(self.deadline.end, self.settings.read_timeout,
                                 self.settings.connect_timeout) as watch:
            try:
                result = attempt(watch)
            except Exception as exc:
                if watch.fired:
                    raise self._fired(url, watch) from None
                if isinstance(exc, Retryable):
                    self._refuse_long_wait(url, exc)
                raise
            if watch.fired:
                raise self._fired(url, watch)
            return result

    def _fired(self, url: str, watch: Watch) -> BaseException:
        if watch.fired == "interrupted":
            return interrupts.Signalled(interrupts.received() or signal.SIGTERM)
        if watch.fired == "deadline":
            return self._expired(url, "no connection yet (name lookup, TCP or TLS handshake)"
                                 if watch.fired_connecting else "the mirror was still sending")
        if watch.fired == "connect":
            return Retryable(f"no connection within {self.settings.connect_timeout:g} s "
                             "(--connect-timeout): the name lookup, TCP or TLS handshake hangs")
        return Retryable(f"less than {STALL_BYTES // 1024} KiB arrived in "
                         f"{self.settings.read_timeout:g} s (--read-timeout): the mirror "
                         "stalls or trickles")

    def _expired(self, url: str, detail: str) -> DeadlineExpired:
        return DeadlineExpired(f"the download deadline of {self.settings.deadline:g} s "
                               f"(--download-deadline) passed during GET {safe(url)}: {detail}")

    def _refuse_long_wait(self, url: str, exc: Retryable) -> None:
        """A Retry-After the deadline cannot honour ends this mirror's attempts now."""
        remaining = self.deadline.remaining()
        if exc.retry_after is not None and exc.retry_after > remaining:
            raise RetryAfterBeyondDeadline(
                f"mirror asked to wait {exc.retry_after:.0f} s, beyond the download deadline "
                f"({max(0.0, remaining):.0f} s left of {self.settings.deadline:g} s) for "
                f"GET {safe(url)} ({exc})")

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Retryable) and exc.retry_after is not None:
            delay = min(exc.retry_after, self.settings.retry_after_max)
        else:
            delay = tenacity.wait_exponential_jitter(
                multiplier=self.settings.backoff_initial, max=self.settings.backoff_max,
                jitter=self.settings.backoff_initial)(state)
        return max(0.0, min(delay, self.deadline.remaining()))

    def _log_retry(self, url: str) -> Callable[[tenacity.RetryCallState], None]:
        def log(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            self.log.warning("download retry", url=safe(url), attempt=state.attempt_number,
                             reason=scrub(str(exc), url),
                             sleep_s=round(state.next_action.sleep, 2) if state.next_action
                             else 0)
        return log

    # ------------------------------------------------------------ one attempt

    def _timeout(self, url: str) -> tuple[float, float]:
        remaining = self.deadline.remaining()
        if remaining <= 0:
            raise self._expired(url, "no time left to start it")
        return (min(self.settings.connect_timeout, remaining),
                min(self.settings.read_timeout, remaining))

    def _get(self, url: str, headers: dict[str, str]) -> requests.Response:
        try:
            response = self.session.get(url, headers={"Accept-Encoding": "identity", **headers},
                                        stream=True, timeout=self._timeout(url),
                                        verify=self.verify,
                                        hooks={"response": [self._no_downgrade]})
        except requests.exceptions.SSLError as exc:
            raise tls_error(url, exc) from None
        except NETWORK_ERRORS as exc:
            raise Retryable(network_cause(exc, url)) from None
        except (requests.RequestException, ValueError) as exc:
            raise DownloadError(scrub(f"GET {safe(url)} failed: {type(exc).__name__}: {exc}",
                                      url)) from None
        return response

    def _no_downgrade(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        """Checked on every response, before requests follows a redirect."""
        if not response.is_redirect or self.settings.allow_http:
            return
        target = urllib.parse.urljoin(response.url, response.headers.get("location", ""))
        if not target.lower().startswith("https://"):
            response.close()
            raise DownloadError(f"{safe(response.url)} redirected to plain http:// "
                                f"({safe(target)}); refused",
                                remedy="fix the mirror or pass --allow-http")

    def _get_small(self, url: str, limit: int, watch: Watch,
                   oversize: type[IntegrityError]) -> bytes:
        with self._get(url, {}) as response:
            check_status(response, url)
            read = getattr(response.raw, "read1", response.raw.read)
            data = bytearray()
            try:
                while len(data) <= limit and (chunk := read(min(STALL_BYTES,
                                                                limit + 1 - len(data)))):
                    data += chunk
                    watch.progress(len(chunk))
            except NETWORK_ERRORS as exc:
                raise Retryable(network_cause(exc, url)) from None
        if len(data) > limit:
            raise oversize(f"{safe(url)} is larger than the {limit} bytes allowed")
        return bytes(data)

    def _attempt(self, url: str, partial: _Partial, watch: Watch) -> None:
        headers = {}
        if partial.received:
            headers["Range"] = f"bytes={partial.received}-"
            if partial.validator:
                headers["If-Range"] = partial.validator
        with self._get(url, headers) as response:
            if response.status_code == 416 and partial.received == partial.size:
                return
            check_length(response, url, partial.size, partial.received)
            check_status(response, url)
            self._position(response, partial, url)
            try:
                self._stream(response, partial, watch)
            except NETWORK_ERRORS as exc:
                raise Retryable(f"after {partial.received} bytes of the answer: "
                                f"{network_cause(exc, url)}") from None
        if partial.size is not None and partial.received < partial.size:
            raise Retryable(f"body ended after {partial.received} of {partial.size} bytes")

    def _position(self, response: requests.Response, partial: _Partial, url: str) -> None:
        """Continue after a 206 that starts where we stopped; otherwise start over."""
        if partial.received and response.status_code == 206:
            match = _CONTENT_RANGE_RE.match(response.headers.get("Content-Range", ""))
            total = match.group(3) if match else None
            if match and int(match.group(1)) == partial.received and (
                    total == "*" or partial.size is None or int(total or 0) == partial.size):
                partial.resumes += 1
                self.log.info("download resumed", url=safe(url), offset=partial.received)
                return
        if partial.received:
            partial.restarts += 1
            self.log.warning("download restarted", url=safe(url), status=response.status_code,
                             reason="file changed on the server or range not honoured")
            if self.progress:
                self.progress.advance(-partial.received)
            partial.reset()
        partial.validator = validator(response)
        partial.headers = response.headers

    def _stream(self, response: requests.Response, partial: _Partial, watch: Watch) -> None:
        # read1: what has arrived, so a timeout mid-chunk loses nothing already received
        read = getattr(response.raw, "read1", response.raw.read)
        chunk_size, progress = self.settings.chunk_size, self.progress
        with partial.path.open("ab", buffering=0) as out, HashPipe(partial.hasher) as hasher:
            while chunk := read(chunk_size):
                partial.received += len(chunk)
                if partial.size is not None and partial.received > partial.size:
                    raise ChecksumMismatch(f"{safe(response.url)} sent more than the "
                                           f"{partial.size} bytes its manifest lists")
                if partial.limit is not None and partial.received > partial.limit:
                    raise IntegrityError(f"{safe(response.url)} is larger than the "
                                         f"{partial.limit} bytes allowed")
                hasher.put(chunk)
                out.write(chunk)
                watch.progress(len(chunk))
                if progress:
                    progress.advance(len(chunk))

    def _copy_local(self, url: str, partial: _Partial) -> None:
        limit = partial.size if partial.size is not None else 1 << 40
        with open_local(url) as source, partial.path.open("ab") as out:
            while chunk := source.read(min(self.settings.chunk_size,
                                           limit + 1 - partial.received)):
                if self.deadline.remaining() <= 0:
                    raise self._expired(url, f"{partial.received} bytes copied")
                interrupts.raise_if_received()
                partial.received += len(chunk)
                partial.hasher.update(chunk)
                out.write(chunk)
                if self.progress:
                    self.progress.advance(len(chunk))
                if partial.received > limit:
                    break

    def _check(self, url: str, partial: _Partial, sha256: str) -> None:
        actual = partial.hasher.hexdigest()
        if partial.received != partial.size or actual != sha256:
            raise ChecksumMismatch(
                f"{safe(url)}: got {partial.received} bytes with sha256 {actual[:16]}..., the "
                f"manifest says {partial.size} bytes, {sha256[:16]}...",
                remedy="the mirror serves a corrupt or different file: republish it")


# ---------------------------------------------------------------- helpers


class _Expired:
    """Quacks like threading.Event for tenacity.stop_when_event_set."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline

    def is_set(self) -> bool:
        return self.deadline.remaining() <= 0


