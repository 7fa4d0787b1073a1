"""How the builder reaches a distribution's archive (apt, dnf): through the project's own
downloader (retries, resume, deadline, CA bundle), handed in by the command line.

The builder is a shared room and may not import a stage (`installer.stages.fetch.download`
holds the downloader), so it names only what it needs of it here; the CLI passes the real
`Downloader`, which has exactly these methods, and tests pass the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Remote(Protocol):
    """The two calls an archive client makes: small signed documents, and files whose size
    and sha256 the signed documents vouch for (a mismatch raises, nothing is kept)."""

    def fetch_bytes(self, url: str, limit: int) -> bytes:
        """A document of at most `limit` bytes (InRelease, repomd.xml, an index)."""
        ...

    def fetch_file(self, url: str, dest: Path, *, size: int, sha256: str) -> None:
        """`url` into `dest`, hashed while it streams; ChecksumMismatch when it differs."""
        ...
