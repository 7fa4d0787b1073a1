"""The manifest's optional `ima`: signatures the stage sets as files' `security.ima` xattr.

COS appraises GSP firmware with IMA: each firmware file needs Google's signature in its
`security.ima` extended attribute, or the kernel refuses to load it. The signatures travel
in the manifest (base64, one per firmware file), so the package stays an ordinary tree of
hashed files; manifests without the field keep their digest (written only when present).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

XATTR = "security.ima"
MAX_SIGNATURE = 4096  # an RSA-4096 IMA signature is 520 bytes
_KEYS = {"file", "signature"}


@dataclass(frozen=True)
class ImaEntry:
    """The IMA signature one firmware file of the package is staged with."""

    file: str
    signature: bytes


def parse_ima(value: Any, firmware_files: set[str],
              fail: Callable[[str, str], Exception]) -> tuple[ImaEntry, ...]:
    """Validate the `ima` list: firmware files of the package, once each, base64 values."""
    if not isinstance(value, list):
        raise fail("ima", "must be a list")
    entries, seen = [], set()
    for i, obj in enumerate(value):
        where = f"ima[{i}]"
        if not isinstance(obj, dict) or set(obj) != _KEYS:
            raise fail(where, "must be an object with exactly file, signature")
        if obj["file"] not in firmware_files or obj["file"] in seen:
            raise fail(f"{where}.file", f"{str(obj['file'])[:80]!r} is not a firmware file "
                       "of the package, or is listed twice")
        seen.add(obj["file"])
        try:
            signature = base64.b64decode(str(obj["signature"]), validate=True)
        except binascii.Error:
            raise fail(f"{where}.signature", "is not base64") from None
        if not 0 < len(signature) <= MAX_SIGNATURE:
            raise fail(f"{where}.signature", f"must be 1 to {MAX_SIGNATURE} bytes")
        entries.append(ImaEntry(obj["file"], signature))
    return tuple(entries)


def ima_to_list(entries: tuple[ImaEntry, ...]) -> list[dict[str, str]]:
    return [{"file": e.file, "signature": base64.b64encode(e.signature).decode()}
            for e in sorted(entries, key=lambda e: e.file)]
