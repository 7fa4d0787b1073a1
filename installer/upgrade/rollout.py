"""A second bound on how many nodes upgrade at once, beside the DaemonSet's maxUnavailable.

The DaemonSet controller already bounds a RollingUpdate; this guard also holds when pods are
recreated by hand (OnDelete) or by several rollouts at once. Before cordoning, the installer
counts the other unavailable nodes, as NVIDIA's upgrade library counts against
maxUnavailable: every node of the installer's (labelled `<prefix>/driver-version`, which the
signal stage sets on each node it served) that is cordoned or NotReady for any reason, plus
every node whose `<prefix>/upgrade-state` says an upgrade is under way or failed (a failed
node stays cordoned). It waits while they reach UPGRADE_MAX_UNAVAILABLE. Two nodes deciding
in the same instant can both go: the guard is best effort, the controller is not.
"""

from __future__ import annotations

import math
import time
from typing import Any

from installer.compat.nodelabels import OWN_PREFIX, UPGRADE_STATE
from installer.errors import UpgradeTimeoutError
from installer.node import kube

BUSY_STATES = ("cordon-required", "pod-deletion-required", "validation-required",
               "uncordon-required", "upgrade-failed")
MANAGED_LABEL = f"{OWN_PREFIX}/driver-version"  # every node this installer has served


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
        why[_name(item)] = str(((item.get("metadata") or {}).get("labels") or {})
                               .get(UPGRADE_STATE))
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


def _name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def wait_turn(api: kube.ApiServer, node: str, max_unavailable: str, *, deadline: float,
              interval: float) -> None:
    """Return once fewer than the limit of other nodes are unavailable; else time out."""
    while True:
        down, total = unavailable(api, node)
        allowed = limit(max_unavailable, max(total, len(down) + 1))
        if len(down) < allowed:
            return
        if time.monotonic() >= deadline:
            named = ", ".join(f"{name} ({why})" for name, why in down.items())
            raise UpgradeTimeoutError(
                f"{len(down)} other node(s) are unavailable: {named}; "
                f"UPGRADE_MAX_UNAVAILABLE={max_unavailable}; nothing was cordoned",
                remedy="finish or fix those nodes (upgrades: their Events say why; cordoned "
                       "or NotReady nodes: their owners), or raise UPGRADE_MAX_UNAVAILABLE")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
