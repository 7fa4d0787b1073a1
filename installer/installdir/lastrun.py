"""`.last-install.json` in the install dir: how the last `install` ended, for the agent's
metrics (exit code, failed stage, fast path, stage durations).

`.state.json` records only verified installs; a failed run leaves no trace there, so the
outcome of every run that held the node lock is kept here too (atomically; small).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from installer.installdir.layout import LAST_INSTALL_FILE
from installer.node.host import write_atomic
from installer.packages.documents import DocumentError, read_document, read_file

MAX_BYTES = 16 * 1024


@dataclass(frozen=True)
class LastInstall:
    """One `install` run's outcome."""

    exit_code: int
    fast_path: bool
    stage: str = ""  # the failing stage, "" on success
    timings_ms: dict[str, float] = field(default_factory=dict)
    finished_at: float = 0.0


def write_last_install(install_dir: Path, outcome: LastInstall) -> None:
    """Record a run's outcome (never raises: the install's own result matters more)."""
    data = {**asdict(outcome), "finished_at": time.time()}
    try:
        write_atomic(install_dir / LAST_INSTALL_FILE, (json.dumps(data) + "\n").encode())
    except Exception:  # a full disk must not mask the install's real error
        return


def read_last_install(install_dir: Path) -> LastInstall | None:
    """The last outcome, or None when absent or malformed (then no metric says otherwise)."""
    try:
        data = read_file(install_dir / LAST_INSTALL_FILE, MAX_BYTES)
        if data is None:
            return None
        obj = read_document(data, name=LAST_INSTALL_FILE, limit=MAX_BYTES)
    except DocumentError:
        return None
    return _decode(obj)


def _decode(obj: dict[str, Any]) -> LastInstall | None:
    code, fast, stage = obj.get("exit_code"), obj.get("fast_path"), obj.get("stage", "")
    timings = obj.get("timings_ms", {})
    if not (isinstance(code, int) and not isinstance(code, bool) and isinstance(fast, bool)
            and isinstance(stage, str) and isinstance(timings, dict)):
        return None
    clean = {str(k): float(v) for k, v in timings.items()
             if isinstance(v, int | float) and not isinstance(v, bool)}
    finished = obj.get("finished_at", 0.0)
    return LastInstall(code, fast, stage, clean,
                       float(finished) if isinstance(finished, int | float) else 0.0)
