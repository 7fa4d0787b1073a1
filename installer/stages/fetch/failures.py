"""How fetch fails: its finer error classes, and one line for "every source failed".

When no source delivers, the operator reads one line naming each source and its real cause
("index.json is not valid JSON", "TLS verification failed"), never a bare "package not
found". The exit code is that of the most telling cause, by this rule:

1. a passed download deadline ends the run at once (6): no time is left to try anything;
2. otherwise the highest rank wins: a local failure (any code other than 5, 6, 7: the
   cache cannot be written, a setting is wrong) > integrity (7: a source served something
   malformed, oversize, of the wrong identity or hash, or a path that climbs out) >
   download (6: TLS, connection, HTTP errors after retries, a redirect to plain http, a
   Retry-After beyond the deadline) > not found (5: 404, no index, not listed);
3. among equal ranks, the first source in the configured order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from installer.errors import (
    DownloadError,
    InstallerError,
    IntegrityError,
    PackageNotFoundError,
)

MAX_CAUSE_CHARS = 300


class NotOnMirror(PackageNotFoundError):
    """The mirror answered 404, 403 or 410 (or has no such file): the next mirror is tried."""


class ChecksumMismatch(IntegrityError):
    """A downloaded file's size or sha256 differs from its manifest entry."""


class ShortOnMirror(ChecksumMismatch):
    """The mirror's file has another size than its manifest entry: that mirror's copy of
    the package is inconsistent (manifest and files published apart)."""

    default_remedy = ("republish the package on that mirror (its manifest and files "
                      "differ), or list a mirror that holds it whole")


class DeadlineExpired(DownloadError):
    """The run's download deadline passed (mid-stream included): nothing more is tried."""

    default_remedy = ("raise --download-deadline (DOWNLOAD_DEADLINE), use a faster or closer "
                      "mirror, or preload the package")


class TlsError(DownloadError):
    """The mirror's TLS certificate could not be verified (or the handshake failed)."""

    default_remedy = ("pass the mirror's CA certificate (PEM) with --ca-bundle "
                      "(DRIVER_CA_BUNDLE), or fix the mirror's certificate")


class RetryAfterBeyondDeadline(DownloadError):
    """The mirror asked to be retried later than the download deadline allows."""

    default_remedy = ("use another mirror, or raise --download-deadline (DOWNLOAD_DEADLINE) "
                      "beyond the wait the mirror asks for")


_RANK = {PackageNotFoundError.code: 0, DownloadError.code: 1, IntegrityError.code: 2}
_BY_CODE: dict[int, type[InstallerError]] = {
    PackageNotFoundError.code: PackageNotFoundError, DownloadError.code: DownloadError,
    IntegrityError.code: IntegrityError}


@dataclass(frozen=True)
class SourceFailure:
    """Why one source could not deliver (its index, its manifest or a file)."""

    source: str
    error: InstallerError


def _rank(error: InstallerError) -> int:
    return _RANK.get(error.code, 3)


def cause(failure: SourceFailure, *, alone: bool = False) -> str:
    """A source's cause without its name repeated; shortened only to sit beside others."""
    text = failure.error.message.removeprefix(failure.source).lstrip(": ") or "failed"
    if alone or len(text) <= MAX_CAUSE_CHARS:
        return text
    return text[:MAX_CAUSE_CHARS - 3] + "..."


def combined(what: str, failures: Sequence[SourceFailure]) -> InstallerError:
    """One error for `what` failing on every source, coded by the most telling cause."""
    if not failures:
        return PackageNotFoundError(what)
    for failure in failures:
        if isinstance(failure.error, DeadlineExpired):
            return failure.error
    best = max(failures, key=lambda f: _rank(f.error))  # max keeps the first of equals
    merged = _merged(failures)
    causes = "; ".join(f"{f.source}: {cause(f, alone=len(merged) == 1)}" for f in merged)
    cls = _BY_CODE.get(best.error.code)
    if cls is None:  # a local failure: the sources are not to blame, report it as it is
        return best.error
    return cls(f"{what}: {causes}", remedy=best.error.remedy)


def _merged(failures: Sequence[SourceFailure]) -> list[SourceFailure]:
    """One entry per distinct (source, cause), in order."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for failure in failures:
        key = (failure.source, failure.error.message)
        if key not in seen:
            seen.add(key)
            kept.append(failure)
    return kept
