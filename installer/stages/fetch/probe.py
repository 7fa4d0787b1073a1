"""Does an object exist on a mirror or bucket? One HEAD request, retried and bounded like
every download, its body never read (`preflight` checks COS artifacts without fetching)."""

from __future__ import annotations

import requests

from installer.errors import DownloadError
from installer.stages.fetch.download import Downloader
from installer.stages.fetch.failures import NotOnMirror
from installer.stages.fetch.local import local_path
from installer.stages.fetch.responses import (
    NETWORK_ERRORS,
    Retryable,
    check_status,
    network_cause,
    tls_error,
)
from installer.stages.fetch.urls import safe, scrub
from installer.stages.fetch.watchdog import Watch


def exists(downloader: Downloader, url: str) -> bool:
    """True when `url` answers 200; False for 403, 404 or 410; DownloadError for the rest
    (after the downloader's retries of 408, 429, 5xx and connection errors)."""
    if url.startswith("file://"):
        return local_path(url).is_file()

    def attempt(_watch: Watch) -> bool:
        try:
            response = downloader.session.head(
                url, timeout=downloader._timeout(url), verify=downloader.verify,
                allow_redirects=True, hooks={"response": [downloader._no_downgrade]})
        except requests.exceptions.SSLError as exc:
            raise tls_error(url, exc) from None
        except NETWORK_ERRORS as exc:
            raise Retryable(network_cause(exc, url)) from None
        except (requests.RequestException, ValueError) as exc:
            raise DownloadError(scrub(f"HEAD {safe(url)} failed: {type(exc).__name__}: "
                                      f"{exc}", url)) from None
        with response:
            check_status(response, url)
        return True

    try:
        return downloader._retry(url, attempt)
    except NotOnMirror:
        return False
