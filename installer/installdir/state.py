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

from installer.installdir.layout import STATE_FILE
from installer.node.host import write_atomic


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


def read_state(install_dir: Path) -> InstallState | None:
    """The last state, or None when absent or unreadable (then we simply do a full run)."""
    try:
        data = json.loads((install_dir / STATE_FILE).read_text(encoding="utf-8"))
        return InstallState(**{k: v for k, v in data.items()
                               if k in InstallState.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def write_state(install_dir: Path, state: InstallState) -> None:
    """Atomically record a verified install."""
    data: dict[str, Any] = {**asdict(state), "written_at": time.time()}
    write_atomic(install_dir / STATE_FILE, (json.dumps(data, indent=2) + "\n").encode())


def clear_state(install_dir: Path) -> None:
    """Forget the last install (uninstall, or a failed verification of it)."""
    (install_dir / STATE_FILE).unlink(missing_ok=True)
