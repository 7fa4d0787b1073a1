"""The record of an upgrade held back by the Node's `upgrade.skip` label, for `status`.

`status` runs on the node, usually without the Kubernetes API, yet must say "wanted X,
serving Y, skipped by label". So the run that skips writes `.skipped.json` in the install
dir (beside, never inside, what serves), and the next run that does not skip removes it.
"""

from __future__ import annotations

import json
from typing import Any

from installer.config import Config
from installer.errors import StagingError
from installer.installdir.layout import SKIPPED_FILE
from installer.installdir.readiness import remove_document
from installer.node import kmod
from installer.node.host import Host, Roots, write_atomic
from installer.packages.documents import DocumentError, read_document, read_file

MAX_SKIPPED_BYTES = 16 * 1024


def record(config: Config, roots: Roots, *, wanted: str, serving: str, label: str) -> None:
    """Say that `wanted` was not installed because `label` keeps `serving`."""
    document = {"wanted": wanted, "serving": serving, "skipped_by": label}
    path = roots.node(config.install_dir) / SKIPPED_FILE
    try:
        write_atomic(path, json.dumps(document, indent=2).encode())
    except OSError as exc:
        raise StagingError(f"cannot write {path}: {exc.strerror or exc}") from exc


def forget(config: Config, roots: Roots) -> None:
    """A run that does not skip: the record, if any, no longer holds."""
    remove_document(roots.node(config.install_dir) / SKIPPED_FILE, "remove")


def current(config: Config, host: Host) -> dict[str, Any] | None:
    """The record while it still describes the node (the driver it kept is the loaded one);
    None when absent, malformed or stale."""
    path = host.roots.node(config.install_dir) / SKIPPED_FILE
    try:
        data = read_file(path, MAX_SKIPPED_BYTES)
        document = None if data is None else read_document(
            data, name=SKIPPED_FILE, source=str(path), limit=MAX_SKIPPED_BYTES)
    except DocumentError:
        return None
    loaded = kmod.loaded_driver(host)
    if document is None or loaded is None or document.get("serving") != loaded.version:
        return None
    return document
