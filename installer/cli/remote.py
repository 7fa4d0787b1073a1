"""The downloader that `package build` hands to the archive clients (apt, dnf, COS)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog

from installer.packages.builder.remote import Remote


@contextmanager
def archive_remote(ca_bundle: Path | None, allow_http: bool) -> Iterator[Remote]:
    """The project's downloader with `--ca-bundle` / `--allow-http`, closed afterwards
    (imported here: `requests` stays off the start-up of commands that fetch nothing)."""
    from installer.stages.fetch.download import Downloader, DownloadSettings

    downloader = Downloader(DownloadSettings(ca_bundle=ca_bundle, allow_http=allow_http),
                            structlog.get_logger("package-build"))
    try:
        yield downloader
    finally:
        downloader.close()
