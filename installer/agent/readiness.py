"""Readiness after the install: published only while the node can serve.

The install's signal stage holds its readiness (`.ready.json` and gpu-operator's env file)
in the agent's work area `<install dir>/.agent/`; it publishes them itself only on a node
without an NVLink fabric or whose fabric has already completed (`installer.installdir.
readiness`). The agent keeps the held bytes (re-read each round: a rerun of the install
holds new ones, a failed one removes them), deletes the published files when a daemon is
down or the fabric is not complete, and publishes the held bytes, unchanged, when the node
can serve. It never makes readiness up: a node the install did not make ready stays not
ready.

The agent's own view, `<install dir>/.agent.json` (ready, reason, a timestamp), is what the
pod's readinessProbe checks (`agent --probe`): a view older than `STALE_S` means the agent
hangs, and counts as not ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.config import Config
from installer.installdir.layout import AGENT_DIR, AGENT_VIEW
from installer.installdir.readiness import (
    HELD_ENV,
    HELD_READY,
    READY_FREE_TEXT,
    check_ready,
    hold_readiness,
    publish,
    read_held,
    ready_paths,
    withdraw,
)
from installer.node import kmod
from installer.node.documents import DocumentError, read_document
from installer.node.host import Host, write_atomic

VIEW_FILE = AGENT_VIEW
WORK_DIR = AGENT_DIR
SAVED_READY = HELD_READY
SAVED_ENV = HELD_ENV
HEARTBEAT_S = 30.0  # the view is rewritten at least this often while nothing changes
STALE_S = 120.0  # the probe's bound: four heartbeats missed
MAX_VIEW = 64 * 1024


def work_dir(config: Config, host: Host) -> Path:
    """The agent's own work area on the node (config copies, daemon logs, held readiness)."""
    return host.roots.node(config.install_dir) / WORK_DIR


@dataclass
class Saved:
    """The install's readiness, byte for byte, and the driver it names."""

    ready: bytes
    env: bytes
    driver_version: str
    gpus: int = 0


class Keeper:
    """Publishes and withdraws the install's held readiness."""

    def __init__(self, config: Config, host: Host) -> None:
        self.config, self.host = config, host
        self.saved: Saved | None = None

    def capture(self) -> str | None:
        """Keep the install's held readiness (taking the published files as the held copy
        where an older install left none); None when kept and it names the kernel's
        driver, else why there is none to keep."""
        roots = self.host.roots
        held = read_held(self.config, roots)
        if held is None:
            state = check_ready(self.config, self.host)
            ready, env = ready_paths(self.config, roots)
            if not (state.ready and env.is_file()):
                self.saved = None
                return state.reason if not state.ready else f"no env file at {env}"
            held = ready.read_bytes(), env.read_bytes()
            hold_readiness(self.config, roots, *held)
        if self.saved is None or (self.saved.ready, self.saved.env) != held:
            self.saved = _parse(*held)
        if self.saved is None:
            return "the held readiness in the agent's work area is malformed"
        return self.driver_changed()

    def withdraw(self) -> None:
        """Delete `.ready.json` and the env file (the node cannot serve now)."""
        withdraw(self.config, self.host.roots)

    def driver_changed(self) -> str | None:
        """Why the kept readiness does not fit the kernel's driver, if it does not."""
        loaded = kmod.loaded_driver(self.host)
        if self.saved is None or (loaded is not None
                                  and loaded.version == self.saved.driver_version):
            return None
        now = loaded.version if loaded is not None else "no driver"
        return f"readiness was for driver {self.saved.driver_version}, the kernel has {now}"

    def restore(self) -> None:
        """Publish the install's bytes (the caller checked `capture`)."""
        if self.saved is not None:
            publish(self.config, self.host.roots, self.saved.ready, self.saved.env)

    def present(self) -> bool:
        """Are both readiness files on the node now?"""
        return all(path.is_file() for path in ready_paths(self.config, self.host.roots))


def _parse(ready: bytes, env: bytes) -> Saved | None:
    """The held copy as the agent may publish it: a bounded, well-formed document for a
    driver version, else None (never published)."""
    try:
        document = read_document(ready, name=SAVED_READY, limit=MAX_VIEW * 4,
                                 free_text=READY_FREE_TEXT)
    except DocumentError:
        return None
    if not isinstance(document.get("driver_version"), str):
        return None
    gpus = document.get("gpus")
    return Saved(ready, env, document["driver_version"],
                 len(gpus) if isinstance(gpus, list) else 0)


def write_view(config: Config, host: Host, view: dict[str, Any]) -> None:
    """The agent's current view, stamped now (wall clock: the probe is another process)."""
    document = {**view, "updated_at": time.time(), "pid": os.getpid()}
    write_atomic(host.roots.node(config.install_dir) / VIEW_FILE,
                 json.dumps(document, indent=2, sort_keys=True).encode())


def read_view(config: Config, host: Host) -> dict[str, Any] | None:
    """The agent's last view, or None (absent or unreadable)."""
    path = host.roots.node(config.install_dir) / VIEW_FILE
    with contextlib.suppress(OSError, DocumentError):
        data = host.read_bytes(path, MAX_VIEW + 1)
        return None if data is None else read_document(data, name=VIEW_FILE, limit=MAX_VIEW,
                                                      any_text=True)
    return None


@dataclass(frozen=True)
class Probe:
    """What the readinessProbe found."""

    ready: bool
    reason: str

    def to_json(self) -> str:
        return json.dumps({"ready": self.ready, "reason": self.reason}, indent=2)

    def to_text(self) -> str:
        return f"{'ready' if self.ready else 'not ready'}: {self.reason}"


def probe(config: Config, host: Host, *, now: float | None = None) -> Probe:
    """Ready only when the agent said so less than `STALE_S` ago."""
    view = read_view(config, host)
    if view is None:
        return Probe(False, f"no agent view ({VIEW_FILE}) in {config.install_dir}")
    stamp = view.get("updated_at")
    age = (time.time() if now is None else now) - stamp \
        if isinstance(stamp, int | float) else None
    if age is None or not -STALE_S < age < STALE_S:
        return Probe(False, f"the agent's view is stale (updated {age or 0:.0f}s ago): "
                            "the agent is not running or hangs")
    return Probe(bool(view.get("ready") is True), str(view.get("reason", ""))[:300])


def view_path(config: Config, host: Host) -> Path:
    return host.roots.node(config.install_dir) / VIEW_FILE


def remove_view(config: Config, host: Host) -> None:
    """On a clean stop: no view is better than one that looks fresh for two minutes."""
    with contextlib.suppress(FileNotFoundError):
        view_path(config, host).unlink()
