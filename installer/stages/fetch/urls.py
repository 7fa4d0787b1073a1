"""Mirror URLs as they may be shown: never with credentials, in messages never with a query."""

from __future__ import annotations

import urllib.parse


def redact(url: str) -> str:
    """A URL without user and password, for names, logs and results."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urllib.parse.urlunsplit(parts._replace(
        netloc=f"{host}:{parts.port}" if parts.port else host))


def safe(url: str) -> str:
    """A URL without credentials or query string, for logs and messages."""
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(redact(url))._replace(query=""))
