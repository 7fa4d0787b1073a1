"""Cloud Storage's own integrity check: the `x-goog-hash` header (crc32c and md5).

COS artifacts come with no published sha256. Every object Cloud Storage serves carries
`x-goog-hash: crc32c=<base64>,md5=<base64>` (md5 is absent for composite objects), for the
whole object also on a 206. A download is hashed while it streams (sha256 for our own
manifest, md5 and crc32c for this check), and refused when the header is missing or any
digest it names differs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

import google_crc32c

from installer.errors import IntegrityError

HEADER = "x-goog-hash"


class ObjectHashMismatch(IntegrityError):
    """A downloaded object's bytes differ from what Cloud Storage says it stored."""

    default_remedy = ("retry; if it persists the mirror of the COS artifacts serves a damaged "
                      "or altered file")


class Digests:
    """sha256, md5 and crc32c of one stream; `hexdigest()` is the sha256 (hashlib's shape)."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.crc32c = google_crc32c.Checksum()  # type: ignore[no-untyped-call]

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        self.md5.update(chunk)
        self.crc32c.update(chunk)  # type: ignore[no-untyped-call]

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


def parse_header(value: str | None) -> dict[str, bytes]:
    """`crc32c=...,md5=...` (requests joins repeated headers with commas) -> raw digests."""
    found: dict[str, bytes] = {}
    for part in (value or "").split(","):
        name, sep, encoded = part.strip().partition("=")
        if not sep or name not in ("crc32c", "md5"):
            continue
        try:
            found[name] = base64.b64decode(encoded.strip(), validate=True)
        except binascii.Error:
            raise ObjectHashMismatch(f"{HEADER} has a malformed {name} value") from None
    return found


def check(where: str, header: str | None, digests: Digests) -> None:
    """Refuse an object whose header is missing, or whose bytes differ from it."""
    stored = parse_header(header)
    if "crc32c" not in stored:
        raise ObjectHashMismatch(
            f"{where} came without a crc32c in its {HEADER} header, so its bytes cannot be "
            "checked", remedy="serve COS artifacts from Cloud Storage, or from a mirror that "
            f"passes {HEADER} through")
    actual = {"crc32c": digests.crc32c.digest(),  # type: ignore[no-untyped-call]
              "md5": digests.md5.digest()}
    for name, value in stored.items():
        if value != actual[name]:
            raise ObjectHashMismatch(
                f"{where}: {name} of the bytes received is "
                f"{base64.b64encode(actual[name]).decode()}, Cloud Storage says "
                f"{base64.b64encode(value).decode()}")
