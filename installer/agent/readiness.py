"""Readiness after the install: withdrawn while the node cannot serve, restored when it can.

The install's signal stage writes readiness once, from a passed verification: `.ready.json`
and gpu-operator's env file. The agent keeps those exact bytes (in memory, and a copy in its
work area `<install dir>/.agent/` so a restarted agent container finds them while readiness
is withdrawn), deletes both files when a daemon is down or the fabric is not complete, and
writes the same bytes back when the node can serve again. It never makes readiness up: a
node the install did not make ready stays not ready.

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
    READY_FREE_TEXT,
    check_ready,
    clear_readiness,
    ready_paths,
)
from installer.node import kmod
from installer.node.documents import DocumentError, read_document
from installer.node.files import read_capped
from installer.node.host import Host, write_atomic

VIEW_FILE = AGENT_VIEW
WORK_DIR = AGENT_DIR
SAVED_READY = "ready.json"
SAVED_ENV = "driver-ready.env"
HEARTBEAT_S = 30.0  # the view is rewritten at least this often while nothing changes
STALE_S = 120.0  # the probe's bound: four heartbeats missed
MAX_VIEW = 64 * 1024


def work_dir(config: Config, host: Host) -> Path:
    """The agent's own work area on the node (config copies, daemon logs, saved readiness)."""
    return host.roots.node(config.install_dir) / WORK_DIR


@dataclass
class Saved:
    """The install's readiness, byte for byte, and the driver it names."""

    ready: bytes
    env: bytes
    driver_version: str


class Keeper:
    """Withdraws and restores the install's readiness files."""

    def __init__(self, config: Config, host: Host) -> None:
        self.config, self.host = config, host
        self.saved: Saved | None = None

    def capture(self) -> str | None:
        """Keep the install's readiness; None when kept, else why there is none to keep."""
        state = check_ready(self.config, self.host)
        ready, env = ready_paths(self.config, self.host.roots)
        if state.ready and env.is_file() and state.document is not None:
            saved = Saved(ready.read_bytes(), env.read_bytes(),
                          str(state.document.get("driver_version")))
            self._save(saved)
            self.saved = saved
            return None
        self.saved = self._load_saved()
        if self.saved is not None:
            return None
        return state.reason

    def withdraw(self) -> None:
        """Delete `.ready.json` and the env file (the node cannot serve now)."""
        clear_readiness(self.config, self.host.roots)

    def driver_changed(self) -> str | None:
        """Why the kept readiness no longer fits the kernel's driver, if it does not."""
        loaded = kmod.loaded_driver(self.host)
        if self.saved is None or (loaded is not None
                                  and loaded.version == self.saved.driver_version):
            return None
        now = loaded.version if loaded is not None else "no driver"
        return f"readiness was for driver {self.saved.driver_version}, the kernel has {now}"

    def restore(self) -> None:
        """Write the install's bytes back (the caller checked `driver_changed`)."""
        if self.saved is None:
            return
        ready, env = ready_paths(self.config, self.host.roots)
        write_atomic(ready, self.saved.ready)
        write_atomic(env, self.saved.env)

    def present(self) -> bool:
        """Are both readiness files on the node now?"""
        return all(path.is_file() for path in ready_paths(self.config, self.host.roots))

    def _save(self, saved: Saved) -> None:
        directory = work_dir(self.config, self.host)
        if (directory / SAVED_READY).is_file() and \
                (directory / SAVED_READY).read_bytes() == saved.ready:
            return
        write_atomic(directory / SAVED_ENV, saved.env)
        write_atomic(directory / SAVED_READY, saved.ready)

    def _load_saved(self) -> Saved | None:
        """A copy an earlier agent kept, if it is for the driver the kernel has now."""
        directory = work_dir(self.config, self.host)
        try:  # regular files only: a FIFO planted there must not hang the agent
            ready = read_capped(directory / SAVED_READY, MAX_VIEW * 4)
            env = read_capped(directory / SAVED_ENV, MAX_VIEW)
            document = read_document(ready, name=SAVED_READY, limit=MAX_VIEW * 4,
                                     free_text=READY_FREE_TEXT)
        except (OSError, DocumentError):
            return None
        loaded = kmod.loaded_driver(self.host)
        version = document.get("driver_version")
        if loaded is None or loaded.version != version:
            return None
        return Saved(ready, env, str(version))


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
