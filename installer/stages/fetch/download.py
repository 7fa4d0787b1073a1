"""HTTP(S) and file:// downloads: stream to a temp file while hashing, resume, retry, deadline.

The only module that imports `requests` (start-up time matters: `import installer.cli` must
stay light). A download is one pass: each chunk is hashed and written as it arrives; after a
drop the next attempt asks for the rest with `Range` and `If-Range` (the ETag, else the
Last-Modified date), and a server that answers 200 instead makes it start over, never
splice. Retries (tenacity) cover connection errors, timeouts, 408, 429 (honouring
Retry-After) and 5xx, bounded by attempts and by one deadline for the whole run.
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import queue
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
import tenacity
import urllib3

from installer.errors import ConfigError, DownloadError, IntegrityError, PackageNotFoundError
from installer.stages.fetch.progress import Progress
from installer.stages.fetch.urls import safe

T = TypeVar("T")
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_NETWORK_ERRORS = (requests.ConnectionError, requests.Timeout,
                   requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError,
                   ConnectionError, TimeoutError)


class NotOnMirror(PackageNotFoundError):
    """The mirror answered 404, 403 or 410: the next mirror is tried."""


class ChecksumMismatch(IntegrityError):
    """A downloaded file's size or sha256 differs from its manifest entry."""


class Retryable(Exception):
    """A transient failure: another attempt may succeed (after `retry_after` if given)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


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
    hasher: Any = field(default_factory=hashlib.sha256)
    received: int = 0
    validator: str | None = None
    resumes: int = 0
    restarts: int = 0

    def reset(self) -> None:
        self.hasher = hashlib.sha256()
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
        self.session = requests.Session()
        # passed on each request: a session-level value loses to REQUESTS_CA_BUNDLE (requests)
        self.verify: str | bool = str(settings.ca_bundle) if settings.ca_bundle else True
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=max(4, settings.parallel))
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)

    # ------------------------------------------------------------ public

    def fetch_bytes(self, url: str, limit: int) -> bytes:
        """A small document (index.json, manifest.json), at most `limit` bytes."""
        if url.startswith("file://"):
            return _read_local(url, limit)
        return self._retry(url, lambda: self._get_small(url, limit))

    def fetch_file(self, url: str, dest: Path, *, size: int, sha256: str) -> None:
        """Download `url` into `dest` and check size and sha256 (ChecksumMismatch if not)."""
        partial = _Partial(dest, size)
        partial.reset()
        if url.startswith("file://"):
            self._copy_local(url, partial)
        else:
            self._retry(url, lambda: self._attempt(url, partial))
        self._check(url, partial, sha256)

    def close(self) -> None:
        self.session.close()

    # ------------------------------------------------------------ retries

    def _retry(self, url: str, attempt: Callable[[], T]) -> T:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Retryable),
            stop=tenacity.stop_after_attempt(self.settings.attempts)
            | tenacity.stop_when_event_set(_Expired(self.deadline)),  # type: ignore[arg-type]
            wait=self._wait, before_sleep=self._log_retry(url), reraise=True)
        try:
            return retrying(attempt)
        except Retryable as exc:
            raise DownloadError(f"GET {safe(url)} failed after retries: {exc}") from None

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
                             reason=str(exc),
                             sleep_s=round(state.next_action.sleep, 2) if state.next_action
                             else 0)
        return log

    # ------------------------------------------------------------ one attempt

    def _timeout(self) -> tuple[float, float]:
        remaining = self.deadline.remaining()
        if remaining <= 0:
            raise DownloadError("download deadline passed",
                                remedy="raise --download-deadline or use a closer mirror")
        return (min(self.settings.connect_timeout, remaining),
                min(self.settings.read_timeout, remaining))

    def _get(self, url: str, headers: dict[str, str]) -> requests.Response:
        try:
            response = self.session.get(url, headers={"Accept-Encoding": "identity", **headers},
                                        stream=True, timeout=self._timeout(),
                                        verify=self.verify)
        except requests.exceptions.SSLError as exc:
            raise DownloadError(f"TLS error for {safe(url)}: {exc}",
                                remedy="pass --ca-bundle with the mirror's CA") from None
        except _NETWORK_ERRORS as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}") from None
        if response.url.startswith("http://") and not self.settings.allow_http:
            response.close()
            raise DownloadError(f"{safe(url)} redirected to plain http://",
                                remedy="fix the mirror or pass --allow-http")
        return response

    def _get_small(self, url: str, limit: int) -> bytes:
        with self._get(url, {}) as response:
            _check_status(response, url)
            try:
                data = response.raw.read(limit + 1)
            except _NETWORK_ERRORS as exc:
                raise Retryable(f"{type(exc).__name__}: {exc}") from None
        if len(data) > limit:
            raise IntegrityError(f"{safe(url)} is larger than the {limit} bytes allowed")
        return data

    def _attempt(self, url: str, partial: _Partial) -> None:
        headers = {}
        if partial.received:
            headers["Range"] = f"bytes={partial.received}-"
            if partial.validator:
                headers["If-Range"] = partial.validator
        with self._get(url, headers) as response:
            if response.status_code == 416 and partial.received == partial.size:
                return
            _check_status(response, url)
            self._position(response, partial, url)
            try:
                self._stream(response, partial)
            except _NETWORK_ERRORS as exc:
                raise Retryable(f"connection dropped after {partial.received} bytes "
                                f"({type(exc).__name__})") from None
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
        partial.validator = _validator(response)

    def _stream(self, response: requests.Response, partial: _Partial) -> None:
        # read1: what has arrived, so a timeout mid-chunk loses nothing already received
        read = getattr(response.raw, "read1", response.raw.read)
        chunk_size, progress = self.settings.chunk_size, self.progress
        with partial.path.open("ab", buffering=0) as out, _HashPipe(partial.hasher) as hasher:
            while chunk := read(chunk_size):
                partial.received += len(chunk)
                if partial.size is not None and partial.received > partial.size:
                    raise ChecksumMismatch(f"{safe(response.url)} sent more than the "
                                           f"{partial.size} bytes its manifest lists")
                hasher.put(chunk)
                out.write(chunk)
                if progress:
                    progress.advance(len(chunk))

    def _copy_local(self, url: str, partial: _Partial) -> None:
        path = _local_path(url)
        limit = partial.size if partial.size is not None else 1 << 40
        try:
            with path.open("rb", buffering=0) as source, partial.path.open("ab") as out:
                while chunk := source.read(min(self.settings.chunk_size,
                                               limit + 1 - partial.received)):
                    partial.received += len(chunk)
                    partial.hasher.update(chunk)
                    out.write(chunk)
                    if self.progress:
                        self.progress.advance(len(chunk))
                    if partial.received > limit:
                        break
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotOnMirror(f"{url} does not exist") from None

    def _check(self, url: str, partial: _Partial, sha256: str) -> None:
        actual = partial.hasher.hexdigest()
        if partial.received != partial.size or actual != sha256:
            raise ChecksumMismatch(
                f"{safe(url)}: got {partial.received} bytes with sha256 {actual[:16]}..., the "
                f"manifest says {partial.size} bytes, {sha256[:16]}...",
                remedy="the mirror serves a corrupt or different file: republish it")


# ---------------------------------------------------------------- helpers


class _HashPipe:
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

    def __enter__(self) -> _HashPipe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.thread.join()


class _Expired:
    """Quacks like threading.Event for tenacity.stop_when_event_set."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline

    def is_set(self) -> bool:
        return self.deadline.remaining() <= 0


def _check_status(response: requests.Response, url: str) -> None:
    status = response.status_code
    if status in (200, 206):
        return
    if status in (403, 404, 410):
        raise NotOnMirror(f"{safe(url)} answered {status}")
    if status == 429 or status == 408 or status >= 500:
        raise Retryable(f"HTTP {status}", _retry_after(response.headers.get("Retry-After")))
    raise DownloadError(f"{safe(url)} answered HTTP {status}",
                        remedy="check the mirror URL and its access rules")


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds, from either of its two forms."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _validator(response: requests.Response) -> str | None:
    """A strong ETag, else Last-Modified: what If-Range may carry."""
    etag = response.headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("Last-Modified")


def _local_path(url: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))


def _read_local(url: str, limit: int) -> bytes:
    try:
        with _local_path(url).open("rb") as handle:
            data = handle.read(limit + 1)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise NotOnMirror(f"{url} does not exist") from None
    if len(data) > limit:
        raise IntegrityError(f"{url} is larger than the {limit} bytes allowed")
    return data


def file_url(path: Path) -> str:
    return "file://" + urllib.parse.quote(str(os.path.abspath(path)))
