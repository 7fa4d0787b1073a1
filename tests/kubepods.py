"""The fake API server's pod lifecycle (tests/kubefake.py): a deleted pod stays Terminating
until its processes exit, then kubelet's part runs; and the DaemonSet controller that puts a
deleted pod straight back."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kubedocs import Doc, daemonset_doc, pod_doc, validate

if TYPE_CHECKING:
    from kubefake import Cluster


def _terminate(cluster: Cluster, key: str, grace: int | None) -> None:
    """Start the pod's graceful deletion (once): Terminating until its processes exit."""
    pod = cluster.pods[key]
    meta = pod["metadata"]
    if meta.get("deletionTimestamp"):
        return  # already terminating: its deletion goes on as it started
    if grace is None:
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    meta["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta["deletionGracePeriodSeconds"] = grace
    validate(pod)
    exits = cluster.exits_after.get(key, 0.0)
    delay = grace if exits is None else min(exits, grace)
    if delay <= 0:
        _remove(cluster, key, meta["uid"])
        return
    def kubelet() -> None:
        with cluster.lock:
            _remove(cluster, key, meta["uid"])

    timer = threading.Timer(delay, kubelet)
    timer.daemon = True
    cluster.timers.append(timer)
    timer.start()


def _remove(cluster: Cluster, key: str, uid: str) -> None:
    """The pod's processes have ended: kubelet's part runs and the API forgets the pod."""
    pod = cluster.pods.get(key)
    if pod is not None and pod["metadata"]["uid"] == uid:
        del cluster.pods[key]
        cluster.on_evict(pod)
        _daemonset_pod_gone(cluster, pod)


# --- DaemonSets: a controller that puts a deleted pod straight back ---------------------
# The DaemonSet controller keeps one pod per node whose labels match the DaemonSet's
# nodeSelector: a deleted pod comes back after `recreate_after` seconds with a new UID and
# the same owner (what makes "delete the device plugin's pod" not enough on a real
# cluster), and a node label that stops matching (gpu-operator's paused-for-driver-upgrade)
# removes the pod; matching again brings it back. `on_create(pod)` is kubelet starting the
# new pod's containers (the tests start a device-plugin stand-in there). Pods are made
# through `pod_doc`, so they are validated like every other pod the fake serves.


@dataclass
class DaemonSet:
    """One DaemonSet: its pods are `<name>-<n>` in `namespace` on the cluster's node."""

    namespace: str
    name: str
    node_selector: dict[str, str] = field(default_factory=dict)
    recreate_after: float = 0.2
    on_create: Callable[[Doc], None] = lambda pod: None
    empty_dirs: tuple[str, ...] = ()  # emptyDir volumes of its pods
    uid: str = ""
    made: list[str] = field(default_factory=list)  # every pod name it created, in order

    def __post_init__(self) -> None:
        self.uid = self.uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.namespace}/"
                                              f"{self.name}"))

    def owns(self, pod: Doc) -> bool:
        return any(ref.get("uid") == self.uid
                   for ref in pod["metadata"].get("ownerReferences", []))

    def selects(self, node: Doc) -> bool:
        labels = node.get("metadata", {}).get("labels", {})
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    def new_pod(self, node: str, uid: str | None = None) -> Doc:
        """A pod as the controller makes it: owned by this DaemonSet, with its selector."""
        name = f"{self.name}-{len(self.made) + 1:05d}"
        self.made.append(name)
        doc = pod_doc(name, uid or str(uuid.uuid4()), node, namespace=self.namespace,
                      owner="DaemonSet", empty_dirs=self.empty_dirs)
        doc["metadata"]["ownerReferences"][0].update(name=self.name, uid=self.uid)
        if self.node_selector:
            doc["spec"]["nodeSelector"] = dict(self.node_selector)
        validate(doc)
        return doc


def add_daemonset(cluster: Cluster, daemonset: DaemonSet, uid: str | None = None) -> Doc:
    """Register `daemonset` with its pod on the cluster's node already running (`uid`)."""
    cluster.controllers.append(daemonset)
    cluster.daemonsets.setdefault(f"{daemonset.namespace}/{daemonset.name}",
                                  daemonset_doc(daemonset.name, daemonset.namespace))
    pod = daemonset.new_pod(cluster.node_name, uid)
    cluster.pods[f"{daemonset.namespace}/{pod['metadata']['name']}"] = pod
    return pod


def _daemonset_of(cluster: Cluster, pod: Doc) -> DaemonSet | None:
    return next((d for d in cluster.controllers if d.owns(pod)), None)


def _daemonset_pod_gone(cluster: Cluster, pod: Doc) -> None:
    """Called under the lock: schedule the replacement while the node still matches."""
    daemonset = _daemonset_of(cluster, pod)
    if daemonset is not None:
        _later(cluster, daemonset, daemonset.recreate_after)


def _daemonsets_reconcile(cluster: Cluster) -> None:
    """Called under the lock after a node patch: unselected pods go, selected ones come."""
    node = cluster.nodes.get(cluster.node_name, {})
    for daemonset in cluster.controllers:
        mine = [k for k, p in cluster.pods.items() if daemonset.owns(p)]
        if not daemonset.selects(node):
            for key in mine:
                _remove(cluster, key, cluster.pods[key]["metadata"]["uid"])  # kubelet stops it
        elif not mine:
            _later(cluster, daemonset, daemonset.recreate_after)


def _later(cluster: Cluster, daemonset: DaemonSet, delay: float) -> None:
    """The controller's next sync: one pod if the node matches and none is there. With no
    delay it happens within the request that removed the pod (under the lock: the
    controller always wins the race against the caller's next look)."""
    def sync() -> Doc | None:
        node = cluster.nodes.get(cluster.node_name, {})
        if not daemonset.selects(node) or any(daemonset.owns(p)
                                              for p in cluster.pods.values()):
            return None
        pod = daemonset.new_pod(cluster.node_name)
        cluster.pods[f"{daemonset.namespace}/{pod['metadata']['name']}"] = pod
        return pod

    def locked() -> None:
        with cluster.lock:
            pod = sync()
        if pod is not None:
            daemonset.on_create(pod)

    if delay <= 0:
        pod = sync()
        if pod is not None:
            daemonset.on_create(pod)
        return
    timer = threading.Timer(delay, locked)
    timer.daemon = True
    timer.start()
