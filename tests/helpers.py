"""Small helpers the test modules share (import as `from helpers import ...`)."""

from __future__ import annotations

import os
from pathlib import Path


def node_args(root: Path) -> list[str]:
    """CLI flags that point the installer at a host tree built by `make_node`."""
    return ["--host-root", str(root), "--proc-root", str(root / "proc"),
            "--sys-root", str(root / "sys")]


def tree_listing(root: Path) -> dict[str, int]:
    """Every path under root with its size (dirs 0): compare before/after to prove no writes."""
    listing: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            listing[str(path.relative_to(root))] = 0 if path.is_dir() else path.lstat().st_size
    return listing


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    """GET: (status, body), an HTTP error status included; URLError when nothing listens."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
