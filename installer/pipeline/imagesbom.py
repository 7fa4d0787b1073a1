"""The image's SBOM, as `status` reports it: which Python distributions this installer runs
with. The image's build writes a CycloneDX SBOM of its venv beside the interpreter's prefix
(/opt/gpu-node-installer/sbom.cdx.json, docs/image.md); a development install has none and
reports nothing. Read only when `status` asks, so no other command pays for hashing it."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

from installer import __version__

SBOM_NAME = "sbom.cdx.json"
CHUNK = 1 << 16


def describe(prefix: Path | None = None) -> dict[str, Any] | None:
    """{"version", "sbom", "sbom_sha256"} of the image this runs in; None outside one (or
    when the SBOM cannot be read: nothing to vouch for)."""
    path = (prefix if prefix is not None else Path(sys.prefix)) / SBOM_NAME
    digest = hashlib.sha256()
    try:
        with path.open("rb") as sbom:
            while chunk := sbom.read(CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return {"version": __version__, "sbom": str(path),
            "sbom_sha256": digest.hexdigest()}


def image_line(image: dict[str, Any] | None) -> str | None:
    """The text form's line; None (no line) outside an image."""
    if image is None:
        return None
    return (f"Image:           {image['version']}, SBOM {image['sbom']} "
            f"sha256:{image['sbom_sha256']}")
