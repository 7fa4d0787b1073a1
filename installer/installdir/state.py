"""`.state.json` in the install dir: what the last verified install put on this node.

It is the reboot fast path's cache key (kernel + requested version + package digest), and
it is written atomically and only after verification passed, so a crash never leaves a
state that claims more than is true.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from installer.errors import StagingError
from installer.installdir.layout import STATE_FILE
from installer.node.host import write_atomic
from installer.packages.documents import DocumentError, read_document, read_file

MAX_STATE_BYTES = 64 * 1024


@dataclass(frozen=True)
class InstallState:
    """One verified install."""

    installer_version: str
    requested_version: str
    flavour_requested: str
    kernel_release: str
    driver_version: str
    flavour: str
    package_digest: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    written_at: float = 0.0

    def matches(self, *, kernel_release: str, requested_version: str,
                flavour_requested: str) -> bool:
        """Same kernel and same request: the fast path may reuse this package."""
        return (self.kernel_release, self.requested_version, self.flavour_requested) == (
            kernel_release, requested_version, flavour_requested)


def read_state(install_dir: Path, log: Any = None) -> InstallState | None:
    """The last state, or None when absent or unreadable (then we simply do a full run).

    A malformed state is treated as absent, because the full run it causes rewrites it;
    with `log`, a warning names the document and why it was refused.
    """
    path = install_dir / STATE_FILE
    if path.exists() and not path.is_file():  # it could never be rewritten: say so now
        raise StagingError(f"{path} is not a regular file",
                           remedy=f"remove {STATE_FILE} from the install dir and rerun")
    try:
        data = read_file(path, MAX_STATE_BYTES)
        return None if data is None else state_from_bytes(data, str(path))
    except DocumentError as exc:
        if log is not None:
            log.warning("install state ignored", path=str(path), reason=exc.message)
        return None


def state_from_bytes(data: bytes, source: str) -> InstallState:
    """Decode `.state.json` (bounded, strict types), or raise DocumentError naming `source`."""
    obj = read_document(data, name=STATE_FILE, source=source, limit=MAX_STATE_BYTES)
    fields = InstallState.__dataclass_fields__
    text = [name for name in fields if name not in ("timings_ms", "written_at")]
    bad = [name for name in text if not isinstance(obj.get(name), str)]
    timings = obj.get("timings_ms", {})
    if not isinstance(timings, dict) or not all(_number(v) for v in timings.values()):
        bad.append("timings_ms")
    if not _number(obj.get("written_at", 0.0)):
        bad.append("written_at")
    if bad:
        raise DocumentError(f"{STATE_FILE} from {source}: {bad[0]} is missing or mistyped")
    return InstallState(**{k: v for k, v in obj.items() if k in fields})


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def write_state(install_dir: Path, state: InstallState) -> None:
    """Atomically record a verified install."""
    data: dict[str, Any] = {**asdict(state), "written_at": time.time()}
    write_atomic(install_dir / STATE_FILE, (json.dumps(data, indent=2) + "\n").encode())


def clear_state(install_dir: Path) -> None:
    """Forget the last install (uninstall, or a failed verification of it)."""
    (install_dir / STATE_FILE).unlink(missing_ok=True)
