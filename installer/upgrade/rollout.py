"""A second bound on how many nodes upgrade at once, beside the DaemonSet's maxUnavailable.

The DaemonSet controller already bounds a RollingUpdate; this guard also holds when pods are
recreated by hand (OnDelete) or by several rollouts at once. Before cordoning, the installer
counts the other unavailable nodes, as NVIDIA's upgrade library counts against
maxUnavailable: every node of the installer's (labelled `<prefix>/driver-version`, which the
signal stage sets on each node it served) that is cordoned or NotReady for any reason, plus
every node whose `<prefix>/upgrade-state` says an upgrade is under way. A node labelled
`upgrade-failed` counts only while its upgrade touched it (cordoned, or our cordon
annotation still on it): one refused before anything was done still serves, and counting
it would hold every other node back for good. A node waiting for its turn
(`upgrade-required`) never counts. It waits while the others reach UPGRADE_MAX_UNAVAILABLE;
a wait that runs out is UpgradeWaitingError (exit 17), not a failure of the node. A node
already cordoned by our upgrade holds its slot and never waits again (`holds_slot`). Two
nodes deciding in the same instant can both go: the guard is best effort, the controller
is not.
"""

from __future__ import annotations

import math
import time
from typing import Any

from installer.compat.nodelabels import OWN_PREFIX, UPGRADE_STATE
from installer.errors import UpgradeWaitingError
from installer.node import kube

FAILED = "upgrade-failed"
BUSY_STATES = ("cordon-required", "pod-deletion-required", "validation-required",
               "uncordon-required", FAILED)
MANAGED_LABEL = f"{OWN_PREFIX}/driver-version"  # every node this installer has served
CORDONED_BY = f"{OWN_PREFIX}/cordoned-by"  # annotation: this installer cordoned the node


def limit(max_unavailable: str, nodes: int) -> int:
    """A count as given, or a percentage of `nodes` rounded up (at least 1), as the
    DaemonSet controller rounds maxUnavailable."""
    if max_unavailable.endswith("%"):
        return max(1, math.ceil(nodes * int(max_unavailable[:-1]) / 100))
    return int(max_unavailable)


def unavailable(api: kube.ApiServer, node: str) -> tuple[dict[str, str], int]:
    """Other nodes that count against the limit, each with why; and the pool's size."""
    managed = kube.list_items(api, "/api/v1/nodes", labelSelector=MANAGED_LABEL)
    selector = f"{UPGRADE_STATE} in ({','.join(BUSY_STATES)})"
    upgrading = kube.list_items(api, "/api/v1/nodes", labelSelector=selector)
    why: dict[str, str] = {}
    for item in managed:
        reason = _down(item)
        if reason:
            why[_name(item)] = reason
    for item in upgrading:
        state = str(((item.get("metadata") or {}).get("labels") or {}).get(UPGRADE_STATE))
        if state != FAILED or _touched(item):
            name = _name(item)
            why[name] = f"{state}, {why[name]}" if name in why else state
    why.pop(node, None)
    why.pop("", None)
    return dict(sorted(why.items())), len(managed)


def _down(node: dict[str, Any]) -> str | None:
    """`cordoned` (spec.unschedulable) or `NotReady` (the Ready condition is not True)."""
    if (node.get("spec") or {}).get("unschedulable") is True:
        return "cordoned"
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = [c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"]
    return None if ready and ready[0].get("status") == "True" else "NotReady"


def _touched(node: dict[str, Any]) -> bool:
    """Whether an upgrade left the node unavailable: cordoned or NotReady, or still carrying
    our cordon annotation (an upgrade that failed after its cordon)."""
    annotations = (node.get("metadata") or {}).get("annotations")
    return _down(node) is not None or (isinstance(annotations, dict)
                                       and CORDONED_BY in annotations)


def holds_slot(node: dict[str, Any]) -> bool:
    """This node is cordoned by our upgrade: it counts against the limit already, so it
    resumes without waiting for a turn."""
    annotations = (node.get("metadata") or {}).get("annotations")
    return (node.get("spec") or {}).get("unschedulable") is True and isinstance(
        annotations, dict) and CORDONED_BY in annotations


def _name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def wait_turn(api: kube.ApiServer, node: str, max_unavailable: str, *, deadline: float,
              interval: float) -> None:
    """Return once fewer than the limit of other nodes are unavailable; else
    UpgradeWaitingError: this node's turn did not come, which is no failure of its own."""
    while True:
        down, total = unavailable(api, node)
        allowed = limit(max_unavailable, max(total, len(down) + 1))
        if len(down) < allowed:
            return
        if time.monotonic() >= deadline:
            named = ", ".join(f"{name} ({why})" for name, why in down.items())
            raise UpgradeWaitingError(
                f"this node's turn did not come within UPGRADE_TIMEOUT: {len(down)} other "
                f"node(s) are unavailable: {named}; UPGRADE_MAX_UNAVAILABLE="
                f"{max_unavailable}; this node was not cordoned and no pod was evicted: "
                "its old driver still serves",
                remedy="finish or fix those nodes (upgrades: their Events say why; cordoned "
                       "or NotReady nodes: their owners), or raise UPGRADE_MAX_UNAVAILABLE; "
                       "the next run waits for its turn again")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
