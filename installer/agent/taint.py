"""The startup taint on this node: removed once the agent has made the node ready, put back
on withdrawal only when asked (`STARTUP_TAINT_RESTORE=on`).

Node pools register GPU nodes with the taint (kubelet `--register-with-taints`, GKE node
pool taints, Karpenter `startupTaints`), so the scheduler places no GPU pod before the
driver is ready even though the device plugin already advertises `nvidia.com/gpu`. Only
`spec.taints` changes, and only the one entry (key and effect) named by the setting: the
agent reads the Node, computes the list without (or with) that entry, and sends it as a
JSON merge patch that carries the `metadata.resourceVersion` it read. The API server then
writes only if the Node has not changed since (else 409 Conflict: read again and retry),
so a taint another controller added in between is never lost.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from installer.config import Config
from installer.config.taint import Taint

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from installer.node.kube import ApiServer

REMOVED, ADDED, ABSENT, PRESENT = "removed", "added", "absent", "present"
CONFLICT = 409
TIMEOUT_S = 15.0  # one verdict's read-and-write, conflicts retried
ATTEMPTS = 5  # a read and a conditional write each; a busy Node rarely conflicts twice


def desired(taints: list[Any], taint: Taint, *, ready: bool, restore: bool
            ) -> list[Any] | None:
    """The Node's new `spec.taints`, or None when nothing is to change.

    Ready: without our entry. Not ready: with it only when `restore` asks; never removed
    then (a node the agent did not make ready keeps whatever taint it has)."""
    ours = [entry for entry in taints if taint.matches(entry)]
    if ready:
        return [entry for entry in taints if not taint.matches(entry)] if ours else None
    if restore and not ours:
        return [*taints, taint.to_api()]
    return None


def sync_startup_taint(api: ApiServer, node: str, *, ready: bool, restore: bool,
                       taint: Taint, timeout: float) -> str:
    """Bring the startup taint in line with readiness: `removed`, `added`, or, when nothing
    had to change, `absent` / `present`. A conflict is retried (ATTEMPTS reads, within
    `timeout` seconds); any other failure is a KubeError for the caller to log."""
    from installer.node import kube

    deadline = time.monotonic() + timeout
    for attempt in range(1, ATTEMPTS + 1):
        current = kube.get_node(api, node)
        metadata = current.get("metadata")
        spec = current.get("spec")
        version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        found = spec.get("taints") if isinstance(spec, dict) else None
        taints = found if isinstance(found, list) else []
        new = desired(taints, taint, ready=ready, restore=restore)
        if new is None:
            return PRESENT if any(taint.matches(entry) for entry in taints) else ABSENT
        body: dict[str, Any] = {"spec": {"taints": new or None}}
        if version:
            body["metadata"] = {"resourceVersion": str(version)}
        try:
            kube.patch_node(api, node, body)
        except kube.KubeError as exc:
            if exc.status != CONFLICT or attempt == ATTEMPTS or time.monotonic() >= deadline:
                raise
            continue  # the Node changed since we read it: read it again
        return REMOVED if ready else ADDED
    raise AssertionError("unreachable: the last attempt returns or raises")


def on_verdict(api: ApiServer, node: str, config: Config, log: FilteringBoundLogger, *,
               ready: bool) -> None:
    """The agent's verdict changed: sync the configured startup taint (none: nothing)."""
    if config.startup_taint is None:
        return
    done = sync_startup_taint(api, node, ready=ready, restore=config.startup_taint_restore,
                              taint=config.startup_taint, timeout=TIMEOUT_S)
    if done in (REMOVED, ADDED):
        log.info(f"startup taint {done}", taint=str(config.startup_taint))
