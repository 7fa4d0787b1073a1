"""Readiness on the node: `.ready.json` in the install dir and gpu-operator's env file.

Written only by the signal stage, from a passed verification; withdrawn (both files) at the
start of every writing run and whenever verification fails. `wait-ready` and `status` read
it here: ready means `.ready.json` names the driver the kernel has loaded now.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.config import Config
from installer.errors import VerificationError
from installer.installdir.layout import READY_FILE, VALIDATION_NODE_PATH
from installer.node import kmod
from installer.node.host import Host, Roots


class NotReadyError(VerificationError):
    """`wait-ready` gave up: no readiness for the loaded driver within the timeout."""


def ready_paths(config: Config, roots: Roots) -> tuple[Path, Path]:
    """`.ready.json` in the install dir and the gpu-operator env file, as paths here."""
    return roots.node(config.install_dir) / READY_FILE, roots.node_entry(VALIDATION_NODE_PATH)


def clear_readiness(config: Config, roots: Roots) -> None:
    """Withdraw readiness: at the start of a run and when verification fails."""
    for path in ready_paths(config, roots):
        path.unlink(missing_ok=True)


def read_ready(config: Config, host: Host) -> dict[str, Any] | None:
    """The current `.ready.json`, or None when the node is not ready."""
    text = host.read_text(ready_paths(config, host.roots)[0])
    if text is None:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


@dataclass(frozen=True)
class Readiness:
    """What `wait-ready` found."""

    ready: bool
    reason: str
    document: dict[str, Any] | None

    def to_json(self) -> str:
        return json.dumps({"ready": self.ready, "reason": self.reason,
                           "readiness": self.document}, indent=2)

    def to_text(self) -> str:
        return f"{'ready' if self.ready else 'not ready'}: {self.reason}"


def check_ready(config: Config, host: Host) -> Readiness:
    """Ready means: `.ready.json` exists and names the driver version the kernel has loaded."""
    document = read_ready(config, host)
    if document is None:
        return Readiness(False, f"no {READY_FILE} in {config.install_dir}", None)
    loaded = kmod.loaded_driver(host)
    if loaded is None:
        return Readiness(False, "no NVIDIA kernel module is loaded", document)
    if loaded.version != document.get("driver_version"):
        return Readiness(False, f"readiness is for driver {document.get('driver_version')} "
                         f"but the kernel has {loaded.version} loaded", document)
    return Readiness(True, f"driver {loaded.version} verified on "
                     f"{len(document.get('gpus') or [])} GPU(s)", document)


def wait_ready(config: Config, host: Host, *, timeout: float,
               interval: float = 2.0) -> Readiness:
    """Poll until ready or the timeout passes (then NotReadyError, exit code 12)."""
    deadline = time.monotonic() + timeout
    while True:
        state = check_ready(config, host)
        if state.ready:
            return state
        if time.monotonic() + interval > deadline:
            raise NotReadyError(f"node not ready after {timeout:g}s: {state.reason}",
                                remedy="look at the installer pod's log on this node")
        time.sleep(interval)
