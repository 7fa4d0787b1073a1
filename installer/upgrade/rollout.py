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
(`upgrade-required`) never counts. Deciding is atomic: a node first takes one of
the pool's slots, a Lease each (`lease`), and goes only while the unavailable nodes and
the holders of lower slots leave room, so two nodes deciding in the same instant never both
go past the limit. A wait that runs out is UpgradeWaitingError (exit 17), not a failure of
the node. A node already cordoned by our upgrade counts against the limit already: it
resumes without a slot and never waits again (`holds_slot`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from installer.compat.nodelabels import OWN_PREFIX, UPGRADE_STATE
from installer.errors import UpgradeWaitingError
from installer.node import kube
from installer.upgrade import lease

FAILED = "upgrade-failed"
BUSY_STATES = ("cordon-required", "wait-for-jobs-required", "pod-deletion-required",
               "validation-required", "uncordon-required", FAILED)
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


def take_turn(api: kube.ApiServer, node: str, max_unavailable: str, *, namespace: str,
              deadline: float, interval: float) -> lease.Slot:
    """Take a pool slot (a Lease, `lease`) and return it once the other unavailable nodes
    leave room; else release it and raise UpgradeWaitingError: this node's turn did not
    come, which is no failure of its own.

    Counted against the limit: the unavailable nodes (`unavailable`) and the holders of
    lower slots (they may be about to cordon). A holder of a higher slot counts once it is
    unavailable, so two holders never wait for each other."""
    slot: lease.Slot | None = None
    try:
        while True:
            down, total = unavailable(api, node)
            allowed = limit(max_unavailable, max(total, len(down) + 1))
            leases = lease.read(api, namespace, allowed)
            now = lease.now()
            holders = {i: lease.holder(doc, now) for i, doc in leases.items()}
            if slot is not None and slot.lost:
                slot = None  # it expired under us (the API did not answer): take one again
            if slot is None:
                slot = _take_free(api, namespace, node, leases, holders)
            if slot is not None and slot.index < allowed:
                ahead = {h for i, h in holders.items() if h and h != node and i < slot.index}
                if len(set(down) | ahead) < allowed:
                    return slot
            if time.monotonic() >= deadline:
                raise _waiting(down, holders, node, max_unavailable)
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
    except BaseException:
        lease.release(slot)
        raise


def _take_free(api: kube.ApiServer, namespace: str, node: str,
               leases: dict[int, dict[str, Any] | None], holders: dict[int, str | None]
               ) -> lease.Slot | None:
    """The first slot that is free (or ours already) and that no other writer takes first."""
    for index in sorted(leases):
        if holders[index] in (None, node):
            slot = lease.take(api, namespace, index, leases[index], node)
            if slot is not None:
                return slot
    return None


def _waiting(down: dict[str, str], holders: dict[int, str | None], node: str,
             max_unavailable: str) -> UpgradeWaitingError:
    named = [f"{name} ({why})" for name, why in down.items()]
    named += [f"{who} (holds upgrade slot {i})" for i, who in sorted(holders.items())
              if who and who != node and who not in down]
    return UpgradeWaitingError(
        f"this node's turn did not come within UPGRADE_TIMEOUT: {len(named)} other "
        f"node(s) are unavailable or upgrading: {', '.join(named)}; "
        f"UPGRADE_MAX_UNAVAILABLE={max_unavailable}; this node was not cordoned and no pod "
        "was evicted: its old driver still serves",
        remedy="finish or fix those nodes (upgrades: their Events say why; cordoned or "
               "NotReady nodes: their owners), or raise UPGRADE_MAX_UNAVAILABLE; the next "
               "run waits for its turn again")
