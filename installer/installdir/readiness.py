"""Readiness on the node: `.ready.json` in the install dir and gpu-operator's env file.

One owner publishes them. The signal stage writes the document and the env file, from a
passed verification, first into the agent's work area (`<install dir>/.agent/`, the held
copy); it publishes them itself only where nothing else must come first: a node without an
NVLink fabric, or a fabric node whose every GPU's fabric has completed. Otherwise the agent
publishes the held copy's exact bytes once the fabric completes. Withdrawn (both files) once
a run is about to change the kernel's driver (the load stage) or what is staged (the stage
stage), and whenever verification fails; never by a run that keeps the serving driver (the
upgrade.skip label, a refused plan). `wait-ready` and `status` read
it here: ready means `.ready.json` names the driver the kernel has loaded now.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.config import Config
from installer.errors import StagingError, VerificationError
from installer.installdir.layout import AGENT_DIR, READY_FILE, VALIDATION_NODE_PATH
from installer.node import kmod
from installer.node.files import read_capped
from installer.node.host import Host, Roots, write_atomic
from installer.packages.documents import DocumentError, read_document

MAX_READY_BYTES = 256 * 1024
HELD_READY = "ready.json"  # the held copy's names in the agent's work area
HELD_ENV = "driver-ready.env"
MAX_HELD_ENV = 64 * 1024
READY_FREE_TEXT = ("name",)  # a GPU's product name, as NVML reports it


class NotReadyError(VerificationError):
    """The node's driver is not ready (the agent's view, `agent --probe`)."""

    slug = "not-ready"


class WaitTimeoutError(NotReadyError):
    """`wait-ready` gave up: no readiness for the loaded driver within the timeout (exit 12
    as every not-ready answer; its own slug, so a script can tell the wait ran out)."""

    slug = "wait-timeout"


def ready_paths(config: Config, roots: Roots) -> tuple[Path, Path]:
    """`.ready.json` in the install dir and the gpu-operator env file, as paths here."""
    return roots.node(config.install_dir) / READY_FILE, roots.node_entry(VALIDATION_NODE_PATH)


def held_paths(config: Config, roots: Roots) -> tuple[Path, Path]:
    """The held copy of `.ready.json` and the env file, in the agent's work area."""
    directory = roots.node(config.install_dir) / AGENT_DIR
    return directory / HELD_READY, directory / HELD_ENV


def hold_readiness(config: Config, roots: Roots, ready: bytes, env: bytes) -> None:
    """Keep readiness for whoever publishes it (the env file first: the document is what
    a reader takes as complete)."""
    held_ready, held_env = held_paths(config, roots)
    write_atomic(held_env, env)
    write_atomic(held_ready, ready)


def read_held(config: Config, roots: Roots) -> tuple[bytes, bytes] | None:
    """The held copy's bytes (bounded reads), or None when there is none."""
    held_ready, held_env = held_paths(config, roots)
    try:  # regular files only: a FIFO planted there must not hang the agent
        return read_capped(held_ready, MAX_READY_BYTES + 1), read_capped(held_env, MAX_HELD_ENV)
    except OSError:
        return None


def publish(config: Config, roots: Roots, ready: bytes, env: bytes) -> None:
    """Make the node ready: the env file, then `.ready.json` (what `wait-ready` reads)."""
    ready_path, env_path = ready_paths(config, roots)
    write_atomic(env_path, env)
    write_atomic(ready_path, ready)


def clear_readiness(config: Config, roots: Roots) -> None:
    """Withdraw readiness and the held copy: before the driver or the staged version
    changes, and when verification fails (nothing may publish it again)."""
    withdraw(config, roots)
    for path in held_paths(config, roots):
        remove_document(path, "withdraw readiness at")


def withdraw(config: Config, roots: Roots) -> None:
    """Withdraw published readiness, keeping the held copy (the agent, while the node
    cannot serve)."""
    for path in ready_paths(config, roots):
        remove_document(path, "withdraw readiness at")


def remove_document(path: Path, what: str) -> None:
    """Remove one of our documents if present; a directory in its place is not ours to
    delete: StagingError (exit 11) naming it."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise StagingError(f"cannot {what} {path}: {exc.strerror}",
                           remedy=f"remove {path.name} by hand and rerun") from None


def read_ready(config: Config, host: Host) -> dict[str, Any] | None:
    """The current `.ready.json`, or None when the node is not ready (absent or malformed)."""
    try:
        return load_ready(config, host)
    except DocumentError:
        return None


def load_ready(config: Config, host: Host) -> dict[str, Any] | None:
    """`.ready.json` decoded (bounded, strict), None when absent; DocumentError when it is
    malformed or unreadable, so `check_ready` can say why the node is not ready."""
    path = ready_paths(config, host.roots)[0]
    if path.exists() and not path.is_file():  # a FIFO would block the read
        raise DocumentError(f"{READY_FILE} at {path} is not a regular file")
    try:
        data = host.read_bytes(path, MAX_READY_BYTES + 1)
    except OSError as exc:
        raise DocumentError(f"{READY_FILE} at {path} cannot be read: {exc.strerror}") from None
    if data is None:
        return None
    return read_document(data, name=READY_FILE, source=str(path), limit=MAX_READY_BYTES,
                         free_text=READY_FREE_TEXT)


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
    try:
        document = load_ready(config, host)
    except DocumentError as exc:
        return Readiness(False, f"{exc.message} (treated as not ready)", None)
    if document is None:
        held = held_paths(config, host.roots)[0].is_file()
        return Readiness(False, f"no {READY_FILE} in {config.install_dir}" + (
            ": the install's readiness is held for the node agent, which publishes it once "
            "the node can serve (on a fabric node: every GPU's fabric completed)"
            if held else ""), None)
    loaded = kmod.loaded_driver(host)
    if loaded is None:
        return Readiness(False, "no NVIDIA kernel module is loaded", document)
    if loaded.version != document.get("driver_version"):
        named = str(document.get("driver_version"))[:40]
        return Readiness(False, f"readiness is for driver {named} "
                         f"but the kernel has {loaded.version} loaded", document)
    gpus = document.get("gpus")
    return Readiness(True, f"driver {loaded.version} verified on "
                     f"{len(gpus) if isinstance(gpus, list) else 0} GPU(s)", document)


def wait_ready(config: Config, host: Host, *, timeout: float,
               interval: float = 2.0) -> Readiness:
    """Poll until ready or the timeout passes (then WaitTimeoutError, exit code 12)."""
    deadline = time.monotonic() + timeout
    while True:
        state = check_ready(config, host)
        if state.ready:
            return state
        if time.monotonic() + interval > deadline:
            raise WaitTimeoutError(f"node not ready after {timeout:g}s: {state.reason}",
                                   remedy="look at the installer pod's log on this node")
        time.sleep(interval)
