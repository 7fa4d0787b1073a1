"""Parse the node's OS identity from os-release and (for COS) lsb-release.

The format is the freedesktop os-release spec: `KEY=value` lines, values optionally quoted
with shell-style escapes. Anything else is reported as one clear error naming file and line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from installer.errors import UnsupportedNodeError
from installer.node.host import Host

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_FILE_BYTES = 64 * 1024


class HostFileError(UnsupportedNodeError):
    """A host file exists but is not in the format its kernel or distribution defines."""


@dataclass(frozen=True)
class OsInfo:
    """What the node runs; COS fields are set only on Container-Optimized OS."""

    id: str
    version_id: str | None
    build_id: str | None
    pretty_name: str | None
    id_like: tuple[str, ...] = ()
    cos_milestone: str | None = None
    cos_build: str | None = None
    cos_board: str | None = None  # lsb-release's CHROMEOS_RELEASE_BOARD: `lakitu`, ...

    @property
    def family(self) -> str:
        """cos, ubuntu, debian, rhel, amzn, or the id itself."""
        for name in ("cos", "ubuntu", "debian", "rhel", "amzn", "fedora", "suse"):
            if self.id == name or name in self.id_like:
                return name
        return self.id


def parse_key_values(text: str, *, source: str) -> dict[str, str]:
    """Parse os-release style text; raise HostFileError naming the line that is malformed."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _KEY_RE.match(key):
            raise HostFileError(f"{source} line {number} is not KEY=value: {raw[:80]!r}",
                                remedy=f"fix or restore {source} on the node")
        values[key] = _unquote(value, source=source, number=number)
    return values


def _unquote(value: str, *, source: str, number: int) -> str:
    if not value or value[0] not in "'\"":
        return value
    try:
        parts = shlex.split(value, posix=True)
    except ValueError:
        raise HostFileError(f"{source} line {number} has an unterminated quote",
                            remedy=f"fix or restore {source} on the node") from None
    return " ".join(parts)


def read_os_info(host: Host) -> OsInfo:
    """Read /etc/os-release (or /usr/lib/os-release) and, for COS, /etc/lsb-release."""
    fields = _first_file(host, ("etc/os-release", "usr/lib/os-release"))
    if fields is None:
        raise UnsupportedNodeError(
            f"no os-release under {host.roots.host} (looked in etc/ and usr/lib/)",
            remedy="mount the node's / at the host root (--host-root, default /host)")
    os_id = fields.get("ID", "linux").lower()
    lsb = _first_file(host, ("etc/lsb-release",)) or {}
    is_cos = os_id == "cos"
    return OsInfo(
        id=os_id,
        version_id=fields.get("VERSION_ID"),
        build_id=fields.get("BUILD_ID"),
        pretty_name=fields.get("PRETTY_NAME"),
        id_like=tuple(fields.get("ID_LIKE", "").lower().split()),
        cos_milestone=(fields.get("VERSION_ID") or lsb.get("CHROMEOS_RELEASE_CHROME_MILESTONE"))
        if is_cos else None,
        cos_build=(fields.get("BUILD_ID") or lsb.get("CHROMEOS_RELEASE_VERSION"))
        if is_cos else None,
        cos_board=lsb.get("CHROMEOS_RELEASE_BOARD") if is_cos else None,
    )


def _first_file(host: Host, candidates: tuple[str, ...]) -> dict[str, str] | None:
    for relative in candidates:
        path: Path = host.roots.host / relative
        data = host.read_bytes(path, MAX_FILE_BYTES)
        if data is not None:
            text = data.decode("utf-8", errors="replace")
            return parse_key_values(text, source=f"/{relative}")
    return None
