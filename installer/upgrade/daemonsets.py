"""GPU DaemonSets during a live upgrade: their pods must not come straight back.

Deleting a DaemonSet's pod makes its controller create another at once, and that one opens
the driver again before the unload. Two ways keep the replacement away until the new
driver is verified:

- gpu-operator's own DaemonSets (UPGRADE_PAUSE_OPERATOR): as NVIDIA's driver manager does,
  each `nvidia.com/gpu.deploy.<component>` node label that is `true` becomes
  `paused-for-driver-upgrade`, so the operator's DaemonSets (which select on it) leave the
  node; we wait for their pods here to end. The previous values are kept in a Node
  annotation (in the same patch), so a run that dies half-way is undone by the next one,
  and are put back after the new driver is verified, or after a failure.
- GKE's device plugin (and any client that must open /dev/nvidiactl first): before its pod
  is deleted, the device nodes it waits for are withdrawn (only those this installer made);
  the replacement waits at that gate while the driver is swapped, and the nodes come back
  once the new driver is verified.

A DaemonSet pod that still comes back and opens the driver is named in the timeout error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from installer.compat.nodelabels import OWN_PREFIX
from installer.errors import UpgradeTimeoutError
from installer.node import kmod, kube
from installer.node.documents import DocumentError, read_document
from installer.node.holders import Holder
from installer.stages import load

if TYPE_CHECKING:
    from installer.context import Context
    from installer.upgrade.selection import Pod

DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-driver-upgrade"
PAUSED_LABELS = f"{OWN_PREFIX}/paused-labels"  # annotation: JSON {label: previous value}
# the operator's driver DaemonSet is not a GPU client: the installer replaces it, as NVIDIA's
# driver manager leaves its own label alone
_NOT_PAUSED = (f"{DEPLOY_PREFIX}driver",)
_MAX_ANNOTATION_BYTES = 256 * 1024  # all of an object's annotations, the API server's cap
_DONE_PHASES = ("Succeeded", "Failed")


@dataclass
class Held:
    """What this run holds back: paused labels, withdrawn device nodes, deleted pods."""

    nodes: list[str] = field(default_factory=list)
    serving: str | None = None  # the driver loaded when the nodes were withdrawn
    deleted: dict[str, str] = field(default_factory=dict)  # pod UID -> owning DaemonSet


class UpgradeView(Protocol):
    """The upgrade's cluster side as this module uses it (`flow.Upgrade` is one): the flow
    imports this module, never the other way round."""

    @property
    def ctx(self) -> Context: ...

    @property
    def api(self) -> kube.ApiServer: ...

    @property
    def node(self) -> str: ...

    @property
    def held(self) -> Held: ...

    def event(self, reason: str, message: str, event_type: str = "Normal") -> None:
        """An Event on the Node (failing to post one is only a warning)."""
        ...


# --- gpu-operator's DaemonSets ------------------------------------------------------------
def to_pause(upgrade: UpgradeView, node: dict[str, Any]) -> set[str]:
    """The deploy labels this upgrade pauses (or paused already, by its annotation)."""
    if not upgrade.ctx.config.upgrade_pause_operator:
        return set()
    labels = _labels(node)
    fresh = {k for k, v in labels.items()
             if k.startswith(DEPLOY_PREFIX) and k not in _NOT_PAUSED and v == "true"}
    return fresh | set(_paused_before(node))


def paused_pod_uids(pods: Iterable[dict[str, Any]], labels: set[str]) -> set[str]:
    """UIDs of DaemonSet pods that select on one of `labels` (the pause removes them)."""
    return {str(p.get("metadata", {}).get("uid")) for p in pods
            if _daemonset_of(p) and _selected_by(p) & labels}


def pausing(upgrade: UpgradeView, pods: Iterable[dict[str, Any]]) -> set[str]:
    """UIDs of the pods the operator pause takes away: their holders neither block the
    upgrade nor are deleted, but their emptyDir data goes all the same."""
    if not upgrade.ctx.config.upgrade_pause_operator:
        return set()
    return paused_pod_uids(pods, to_pause(upgrade, kube.get_node(upgrade.api, upgrade.node)))


def pause(upgrade: UpgradeView, *, deadline: float, interval: float) -> None:
    """Set each `true` deploy label to paused (the previous values into our annotation, in
    the same patch), then wait until the DaemonSet pods selecting on them are gone."""
    node = kube.get_node(upgrade.api, upgrade.node)
    labels = to_pause(upgrade, node)
    if not labels:
        return
    fresh = sorted(k for k in labels if _labels(node).get(k) == "true")
    previous = _paused_before(node) | dict.fromkeys(fresh, "true")
    if fresh:
        kube.patch_node(upgrade.api, upgrade.node, {"metadata": {
            "labels": dict.fromkeys(fresh, PAUSED),
            "annotations": {PAUSED_LABELS: json.dumps(previous, sort_keys=True)}}})
        upgrade.event("DriverUpgradeOperatorPaused", "gpu-operator's GPU DaemonSets leave "
                      f"the node until the new driver is verified: {', '.join(fresh)}="
                      f"{PAUSED}")
    _wait_gone(upgrade, set(previous), deadline=deadline, interval=interval)


def _wait_gone(upgrade: UpgradeView, labels: set[str], *, deadline: float,
               interval: float) -> None:
    """NVIDIA's driver manager waits the same way (it polls every 5 s)."""
    while True:
        pods = [p for p in kube.pods_on_node(upgrade.api, upgrade.node)
                if str(p.get("status", {}).get("phase")) not in _DONE_PHASES]
        left = paused_pod_uids(pods, labels)
        if not left:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(_ref(p) for p in pods if p["metadata"].get("uid") in left)
            raise UpgradeTimeoutError(
                f"gpu-operator's paused DaemonSet pods {names} were still on the node when "
                "UPGRADE_TIMEOUT ran out; nothing was unloaded",
                remedy="check why they do not terminate (`kubectl describe pod`), or raise "
                       "UPGRADE_TIMEOUT; the next run resumes")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def resume(upgrade: UpgradeView, node: dict[str, Any]) -> None:
    """Put back each paused label we paused (only if it still says paused), drop our
    annotation: the operator's DaemonSets return to the node."""
    previous = _paused_before(node)
    if not previous:
        return
    labels = _labels(node)
    back = {k: v for k, v in previous.items() if labels.get(k) == PAUSED}
    kube.patch_node(upgrade.api, upgrade.node, {"metadata": {
        "labels": back, "annotations": {PAUSED_LABELS: None}}})
    upgrade.event("DriverUpgradeOperatorResumed", "gpu-operator's GPU DaemonSets may run "
                  "on the node again: " + ", ".join(f"{k}={v}" for k, v in sorted(back.items())))


# --- GKE's device plugin: its device-file gate ---------------------------------------------
def hold_gate(upgrade: UpgradeView, deleting: Sequence[Pod]) -> None:
    """Before GPU DaemonSet pods are deleted: withdraw the device nodes their replacements
    wait for (ours only), and remember which DaemonSets own the deleted pods."""
    if not deleting:
        return
    uids = {p.uid for p in deleting}
    for pod in kube.pods_on_node(upgrade.api, upgrade.node):
        owner = _daemonset_of(pod)
        if owner and pod.get("metadata", {}).get("uid") in uids:
            upgrade.held.deleted[str(pod["metadata"]["uid"])] = owner
    driver = kmod.loaded_driver(upgrade.ctx.host)
    upgrade.held.serving = driver.version if driver else None
    withdrawn = load.hold_gate(upgrade.ctx)
    upgrade.held.nodes += withdrawn
    if withdrawn:
        upgrade.event("DriverUpgradeGateHeld", "withdrew " + ", ".join(
            f"/dev/{n}" for n in withdrawn) + ": GPU DaemonSet pods started now (GKE's "
            "device plugin) wait for them, until the new driver is verified")
    else:
        upgrade.ctx.log.warning("device-plugin gate not held: the installer did not make "
                                "/dev/nvidiactl or /dev/nvidia-uvm, so it never removes them")


def release_gate(upgrade: UpgradeView, *, verified: bool) -> None:
    """Give the withdrawn nodes back: after verification for the new driver; after a
    failure only while the driver that served before is still the one loaded."""
    if not upgrade.held.nodes:
        return
    driver = kmod.loaded_driver(upgrade.ctx.host)
    loaded = driver.version if driver else None
    if not verified and (loaded is None or loaded != upgrade.held.serving):
        upgrade.ctx.log.warning("device-plugin gate stays closed: no verified driver",
                                nodes=upgrade.held.nodes)
        return
    made = load.release_gate(upgrade.ctx)
    upgrade.held.nodes = []
    upgrade.event("DriverUpgradeGateOpened", "made " + ", ".join(f"/dev/{n}" for n in made)
                  + f" for driver {loaded}: GPU DaemonSet pods may start")


# --- naming what came back ------------------------------------------------------------------
def describe(upgrade: UpgradeView, holders: Sequence[Holder]) -> str:
    """The holders with their pods; a DaemonSet pod created after we deleted its
    predecessor is named as one that came back."""
    try:
        pods = {str(p.get("metadata", {}).get("uid")): p
                for p in kube.pods_on_node(upgrade.api, upgrade.node)}
    except kube.KubeError:
        pods = {}
    came_back = set(upgrade.held.deleted.values())
    named = []
    for holder in holders:
        pod = pods.get(holder.pod.pod_uid) if holder.pod else None
        owner = _daemonset_of(pod) if pod else None
        if pod is None:
            named.append(holder.describe())
        elif owner in came_back and holder.pod and holder.pod.pod_uid not in \
                upgrade.held.deleted:
            named.append(f"{holder.pid} ({holder.command}) in pod {_ref(pod)}, which "
                         f"DaemonSet {owner} recreated after its pod was deleted (a "
                         "DaemonSet pod that keeps coming back: pause that DaemonSet on "
                         "this node, e.g. UPGRADE_PAUSE_OPERATOR for gpu-operator's)")
        else:
            named.append(f"{holder.pid} ({holder.command}) in pod {_ref(pod)}")
    return ", ".join(named)


def _daemonset_of(pod: dict[str, Any]) -> str | None:
    """`namespace/name` of the DaemonSet controlling the pod, else None."""
    meta = pod.get("metadata", {})
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") == "DaemonSet":
            return f"{meta.get('namespace', '')}/{ref.get('name', '')}"
    return None


def _selected_by(pod: dict[str, Any]) -> set[str]:
    """Node label keys the pod's scheduling requires (nodeSelector, required affinity)."""
    spec = pod.get("spec", {})
    keys = set((spec.get("nodeSelector") or {}).keys())
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        keys |= {str(e.get("key")) for e in term.get("matchExpressions") or []}
    return keys


def _paused_before(node: dict[str, Any]) -> dict[str, str]:
    """Our annotation: the labels this installer paused and their values before."""
    annotations = node.get("metadata", {}).get("annotations") or {}
    try:
        found = read_document(str(annotations.get(PAUSED_LABELS) or "{}").encode(
            "utf-8", "replace"), name=PAUSED_LABELS, limit=_MAX_ANNOTATION_BYTES)
    except DocumentError:
        return {}
    return {str(k): str(v) for k, v in found.items() if str(k).startswith(DEPLOY_PREFIX)}


def _labels(node: dict[str, Any]) -> dict[str, Any]:
    labels = node.get("metadata", {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def _ref(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
