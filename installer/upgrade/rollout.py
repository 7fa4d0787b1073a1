"""A second bound on how many nodes upgrade at once, beside the DaemonSet's maxUnavailable.

The DaemonSet controller already bounds a RollingUpdate; this guard also holds when pods are
recreated by hand (OnDelete) or by several rollouts at once. Before cordoning, the installer
counts the other nodes whose `<prefix>/upgrade-state` says an upgrade is under way or failed
(a failed node stays cordoned) and waits while they reach UPGRADE_MAX_UNAVAILABLE. Two nodes
deciding in the same instant can both go: the guard is best effort, the controller is not.
"""

from __future__ import annotations

import math
import time

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


def busy_nodes(api: kube.ApiServer, node: str) -> list[str]:
    """Other nodes whose upgrade is under way (or failed and still cordoned)."""
    selector = f"{UPGRADE_STATE} in ({','.join(BUSY_STATES)})"
    found = kube.list_items(api, "/api/v1/nodes", labelSelector=selector)
    names = (str((n.get("metadata") or {}).get("name", "")) for n in found)
    return sorted(name for name in names if name and name != node)


def wait_turn(api: kube.ApiServer, node: str, max_unavailable: str, *, deadline: float,
              interval: float) -> None:
    """Return once fewer than the limit of other nodes are upgrading; else time out."""
    while True:
        busy = busy_nodes(api, node)
        total = len(kube.list_items(api, "/api/v1/nodes", labelSelector=MANAGED_LABEL)) \
            if max_unavailable.endswith("%") else 0
        allowed = limit(max_unavailable, max(total, len(busy) + 1))
        if len(busy) < allowed:
            return
        if time.monotonic() >= deadline:
            raise UpgradeTimeoutError(
                f"{len(busy)} other node(s) are upgrading or failed ({', '.join(busy)}), "
                f"UPGRADE_MAX_UNAVAILABLE={max_unavailable}; nothing was cordoned",
                remedy="finish or fix those nodes' upgrades (their Events say why), or "
                       "raise UPGRADE_MAX_UNAVAILABLE")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
