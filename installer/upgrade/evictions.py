"""Which pods must go for the GPUs to be free, and making them go through the Eviction API.

The holders (PIDs with /dev/nvidia* open, and their pods from /proc/<pid>/cgroup) are
matched to the API's pods on this node by UID. What must never be evicted blocks the
upgrade before anything is touched: a process outside any pod, a static (mirror) pod, a
DaemonSet pod unless UPGRADE_RESTART_DAEMONSETS allows deleting it. `drain` evicts every
other non-DaemonSet pod too, as `kubectl drain --ignore-daemonsets` would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from installer.errors import UpgradeBlockedError, UpgradeTimeoutError
from installer.node import kube
from installer.node.holders import Holder

# kubelet's annotations on a static pod's mirror: the UID its cgroup is named after
_STATIC_UID_ANNOTATIONS = ("kubernetes.io/config.mirror", "kubernetes.io/config.hash")
_DONE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Pod:
    """One pod on this node, as the upgrade needs to know it."""

    namespace: str
    name: str
    uid: str
    owner_kind: str | None
    static_uid: str | None
    phase: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def daemonset(self) -> bool:
        return self.owner_kind == "DaemonSet"

    @property
    def mirror(self) -> bool:
        return self.owner_kind == "Node" or self.static_uid is not None


def pod_from_api(obj: dict[str, Any]) -> Pod:
    """The fields we use of a core/v1 Pod (missing ones read as empty)."""
    meta = _obj(obj.get("metadata"))
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
    controller = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
    annotations = _obj(meta.get("annotations"))
    static = next((str(annotations[a]) for a in _STATIC_UID_ANNOTATIONS if a in annotations),
                  None)
    kind = controller.get("kind")
    return Pod(str(meta.get("namespace", "")), str(meta.get("name", "")),
               str(meta.get("uid", "")), str(kind) if kind else None, static,
               str(_obj(obj.get("status")).get("phase", "")))


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass
class Plan:
    """Pods to evict and DaemonSet pods to delete; `holders` maps each to its holder PIDs."""

    evict: list[Pod] = field(default_factory=list)
    delete: list[Pod] = field(default_factory=list)
    holders: dict[str, list[int]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.evict and not self.delete


def plan(holders: Sequence[Holder], pods: Sequence[Pod], *, node: str, policy: str,
         restart_daemonsets: bool) -> Plan:
    """What to evict or delete, or UpgradeBlockedError naming every holder we must not
    touch (all of them at once, so one rerun can fix them all)."""
    by_uid = {p.uid: p for p in pods} | {p.static_uid: p for p in pods if p.static_uid}
    result, blocked = Plan(), []
    for holder in holders:
        pod = by_uid.get(holder.pod.pod_uid) if holder.pod else None
        if holder.pod is None:
            blocked.append(f"process {holder.pid} ({holder.command}) is not in a pod")
        elif pod is None:
            blocked.append(f"process {holder.pid} ({holder.command}) is in pod "
                           f"{holder.pod.pod_uid}, which the API does not list on {node}")
        elif pod.mirror:
            blocked.append(f"process {holder.pid} ({holder.command}) is in static pod "
                           f"{pod.ref}, which cannot be evicted")
        elif pod.daemonset and not restart_daemonsets:
            blocked.append(f"process {holder.pid} ({holder.command}) is in DaemonSet pod "
                           f"{pod.ref} (set UPGRADE_RESTART_DAEMONSETS=true to delete it)")
        else:
            _add(result.delete if pod.daemonset else result.evict, pod)
            result.holders.setdefault(pod.ref, []).append(holder.pid)
    if blocked:
        raise UpgradeBlockedError("cannot free the GPUs: " + "; ".join(blocked)
                                  + "; nothing was cordoned, evicted or unloaded")
    if policy == "drain":
        for pod in pods:
            if not (pod.daemonset or pod.mirror or pod.phase in _DONE_PHASES):
                _add(result.evict, pod)
    return result


def _add(pods: list[Pod], pod: Pod) -> None:
    if pod not in pods:
        pods.append(pod)


def evict_all(api: kube.ApiServer, pods: Sequence[Pod], *, grace_s: int | None,
              deadline: float, interval: float, on_event: Callable[[str, str], None]) -> None:
    """Evict each pod; a 429 (a PodDisruptionBudget) is retried until `deadline`."""
    pending = list(pods)
    refused: set[str] = set()
    while True:
        for pod in list(pending):
            outcome = kube.evict(api, pod.namespace, pod.name, grace_s)
            if outcome == "refused":
                if pod.ref not in refused:
                    refused.add(pod.ref)
                    on_event("DriverUpgradeEvictionRefused",
                             f"eviction of {pod.ref} refused (PodDisruptionBudget); retrying")
                continue
            pending.remove(pod)
            on_event("DriverUpgradeEvicted", f"evicted pod {pod.ref} ({outcome})")
        if not pending:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(p.ref for p in pending)
            raise UpgradeTimeoutError(
                f"evicting {names} was still refused (HTTP 429: a PodDisruptionBudget does "
                f"not allow it) when UPGRADE_TIMEOUT ran out; the old driver still serves",
                remedy="relax that PodDisruptionBudget or raise UPGRADE_TIMEOUT; the node "
                       "stays cordoned and the next run resumes")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def delete_all(api: kube.ApiServer, pods: Sequence[Pod], *, grace_s: int | None,
               on_event: Callable[[str, str], None]) -> None:
    """Delete DaemonSet pods (their controller recreates them; eviction would not help)."""
    for pod in pods:
        outcome = kube.delete_pod(api, pod.namespace, pod.name, pod.uid, grace_s)
        on_event("DriverUpgradeDeleted", f"deleted DaemonSet pod {pod.ref} ({outcome})")
