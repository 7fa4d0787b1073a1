"""The manifest's optional `signatures`: who signed each kernel module of a package.

`package build --sign-key/--sign-cert` (origin `signed`) or `--signatures DIR` (origin
`attached`, a vendor's detached signatures) records, per module file, the signer's issuer
and serial (what the PKCS#7 signature names), the certificate's subject and key id when the
certificate is known, and the digest. Manifests without the field stay valid and keep their
digest (the field is written only when present).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ORIGINS = ("signed", "attached")
HASHES = ("sha1", "sha224", "sha256", "sha384", "sha512")
MAX_TEXT = 1024
_HEX_RE = re.compile(r"[0-9a-f]{1,128}")
_KEYS = {"file", "origin", "hash", "issuer", "serial", "subject", "key_id"}


@dataclass(frozen=True)
class SignatureEntry:
    """The signature appended to one module file of the package."""

    file: str
    origin: str
    hash: str
    issuer: str | None  # None only when the signature names its signer by key id alone
    serial: str | None  # lowercase hex
    subject: str | None = None
    key_id: str | None = None  # lowercase hex: subjectKeyIdentifier (or sha1 of the key)


def parse_signatures(value: Any, module_files: set[str],
                     fail: Callable[[str, str], Exception]) -> tuple[SignatureEntry, ...]:
    """Validate the `signatures` list: one entry per module file at most, known values."""
    if not isinstance(value, list):
        raise fail("signatures", "must be a list")
    entries, seen = [], set()
    for i, obj in enumerate(value):
        where = f"signatures[{i}]"
        if not isinstance(obj, dict) or set(obj) != _KEYS:
            raise fail(where, f"must be an object with exactly {', '.join(sorted(_KEYS))}")
        if obj["file"] not in module_files or obj["file"] in seen:
            raise fail(f"{where}.file", f"{str(obj['file'])[:80]!r} is not a module file of "
                       "the package, or is listed twice")
        seen.add(obj["file"])
        if obj["origin"] not in ORIGINS or obj["hash"] not in HASHES:
            raise fail(where, f"origin must be one of {', '.join(ORIGINS)} and hash one of "
                       f"{', '.join(HASHES)}")
        for key in ("issuer", "subject"):
            text = obj[key]
            if text is not None and not (isinstance(text, str) and 0 < len(text) <= MAX_TEXT):
                raise fail(f"{where}.{key}", f"must be null or 1 to {MAX_TEXT} characters")
        for key in ("serial", "key_id"):
            text = obj[key]
            if text is not None and not (isinstance(text, str) and _HEX_RE.fullmatch(text)):
                raise fail(f"{where}.{key}", "must be null or lowercase hex")
        if (obj["issuer"] is None or obj["serial"] is None) and obj["key_id"] is None:
            raise fail(where, "must name the signer: issuer and serial, or key_id")
        entries.append(SignatureEntry(**obj))
    return tuple(entries)


def signatures_to_list(entries: tuple[SignatureEntry, ...]) -> list[dict[str, Any]]:
    return [{"file": e.file, "origin": e.origin, "hash": e.hash, "issuer": e.issuer,
             "serial": e.serial, "subject": e.subject, "key_id": e.key_id} for e in entries]
