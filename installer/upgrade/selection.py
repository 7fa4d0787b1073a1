"""Which pods must go before the driver changes, and which may not go without a setting.

Selected: the pod of every holder the /proc scan finds (PIDs with /dev/nvidia* open, matched
by UID), every pod that asks for a GPU even while idle (a container's or init container's
`nvidia.com/gpu*` or `nvidia.com/mig-*` request or limit, or any DRA `resourceClaims`), every
pod that holds the driver without asking for a GPU (`holds_driver`), and with `drain` every
other pod. Pods that have finished (Succeeded, Failed) are ignored.

Each selected pod then meets kubectl drain's refusals, all decided before anything is touched
(exit 15 naming every refused pod with its reason and the setting that would allow it):
- no controller recreates it (no controller ownerReference, or its DaemonSet is gone, as
  kubectl decides it): evicted only with UPGRADE_FORCE;
- it has `emptyDir` volumes, whose data goes with it: only with UPGRADE_DELETE_EMPTYDIR_DATA,
  whichever way it would go (evicted, deleted as a DaemonSet pod, or taken away by the
  operator pause) and under every policy;
- a static (mirror) pod, a holder outside any pod or unknown to the API: never;
- a live DaemonSet's pod: deleted when it holds the GPUs or the driver and
  UPGRADE_RESTART_DAEMONSETS allows it (else it blocks), otherwise left alone, as `kubectl
  drain --ignore-daemonsets` and NVIDIA's upgrade controller leave DaemonSet pods.
A pod already terminating (someone else deleted it) is only waited for, never refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from installer.errors import UpgradeBlockedError
from installer.node.holders import Holder

# kubelet's annotations on a static pod's mirror: the UID its cgroup is named after
_STATIC_UID_ANNOTATIONS = ("kubernetes.io/config.mirror", "kubernetes.io/config.hash")
_DONE_PHASES = ("Succeeded", "Failed")
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
NVIDIA_RUNTIME_CLASS = "nvidia"  # the toolkit's runtime: it mounts the driver's libraries
# NVIDIA's k8s-dra-driver-gpu chart labels its kubelet-plugin pods so
# (deployments/helm/dra-driver-nvidia-gpu/templates/kubeletplugin.yaml @ 22407113785e)
DRA_PLUGIN_LABEL, DRA_PLUGIN = "nvidia-dra-driver-gpu-component", "kubelet-plugin"
# gpu-operator sets this node label for third-party GPU clients to select on
# (controllers/state_manager.go, gpuStateLabels @ a22dbf671f2e); a client carries it as a
# nodeSelector or as a label of its own
GPU_CLIENT_LABEL = "nvidia.com/gpu.deploy.client"
FORCE, EMPTYDIR = "UPGRADE_FORCE=true", "UPGRADE_DELETE_EMPTYDIR_DATA=true"
RESTART_DAEMONSETS = "UPGRADE_RESTART_DAEMONSETS=true"


@dataclass(frozen=True)
class Pod:
    """One pod on this node, as the upgrade needs to know it."""

    namespace: str
    name: str
    uid: str
    owner_kind: str | None  # the controller ownerReference's kind (None: no controller)
    static_uid: str | None
    phase: str
    owner_name: str = ""
    gpu: str | None = None  # what it asks for: a resource name or "a DRA resourceClaim"
    empty_dirs: tuple[str, ...] = ()
    terminating: bool = False  # metadata.deletionTimestamp is set
    node_owned: bool = False  # an ownerReference to the Node: kubelet's mirror pod
    driver: str | None = None  # why it holds the driver without asking for a GPU

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def daemonset(self) -> bool:
        return self.owner_kind == "DaemonSet"

    @property
    def mirror(self) -> bool:
        return self.owner_kind == "Node" or self.node_owned or self.static_uid is not None

    @property
    def done(self) -> bool:
        return self.phase in _DONE_PHASES


def pod_from_api(obj: dict[str, Any]) -> Pod:
    """The fields we use of a core/v1 Pod (missing ones read as empty)."""
    meta, spec = _obj(obj.get("metadata")), _obj(obj.get("spec"))
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
    controller = next((o for o in owners if o.get("controller") is True), {})
    annotations = _obj(meta.get("annotations"))
    static = next((str(annotations[a]) for a in _STATIC_UID_ANNOTATIONS if a in annotations),
                  None)
    kind = controller.get("kind")
    volumes = [_obj(v) for v in spec.get("volumes") or []]
    return Pod(str(meta.get("namespace", "")), str(meta.get("name", "")),
               str(meta.get("uid", "")), str(kind) if kind else None, static,
               str(_obj(obj.get("status")).get("phase", "")),
               owner_name=str(controller.get("name", "")), gpu=gpu_request(spec),
               empty_dirs=tuple(str(v.get("name", "?")) for v in volumes if "emptyDir" in v),
               terminating=bool(meta.get("deletionTimestamp")),
               node_owned=any(o.get("kind") == "Node" for o in owners),
               driver=holds_driver(meta, spec))


def gpu_request(spec: dict[str, Any]) -> str | None:
    """The first GPU resource a pod spec asks for (containers and init containers, requests
    and limits), or its DRA claims; None for a pod that asks for no GPU."""
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for container in containers:
        resources = _obj(_obj(container).get("resources"))
        for kind in ("limits", "requests"):
            for name in _obj(resources.get(kind)):
                if str(name).startswith(GPU_RESOURCE_PREFIXES):
                    return str(name)
    return "a DRA resourceClaim" if spec.get("resourceClaims") else None


def holds_driver(meta: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """Why a pod holds the driver though it asks for no GPU, or None: the nvidia runtime
    class (its containers get the loaded driver's libraries and device nodes), NVIDIA's DRA
    kubelet plugin (it serves CDI specs of the loaded driver until it restarts), or a
    third-party GPU client by gpu-operator's `nvidia.com/gpu.deploy.client` convention."""
    labels = _obj(meta.get("labels"))
    if spec.get("runtimeClassName") == NVIDIA_RUNTIME_CLASS:
        return f"runtimeClassName {NVIDIA_RUNTIME_CLASS}"
    if labels.get(DRA_PLUGIN_LABEL) == DRA_PLUGIN:
        return "NVIDIA's DRA kubelet plugin, serving CDI specs of the loaded driver"
    if GPU_CLIENT_LABEL in labels or GPU_CLIENT_LABEL in _obj(spec.get("nodeSelector")):
        return f"a GPU client ({GPU_CLIENT_LABEL})"
    return None


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass
class Plan:
    """Pods to evict, DaemonSet pods to delete, pods already terminating (only waited for);
    `holders` maps each pod to its holder PIDs."""

    evict: list[Pod] = field(default_factory=list)
    delete: list[Pod] = field(default_factory=list)
    wait: list[Pod] = field(default_factory=list)
    holders: dict[str, list[int]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.evict and not self.delete and not self.wait

    @property
    def going(self) -> list[Pod]:
        """Every pod that must be gone before the unload."""
        return [*self.evict, *self.delete, *self.wait]


UNTOUCHED = "nothing was cordoned, evicted or unloaded"
STILL_CORDONED = ("the node stays cordoned by this upgrade (a rerun resumes it); nothing was "
                  "unloaded: the old driver still serves")


def undone(cordoned: bool) -> str:
    """What a refusal says of the node: untouched, or still under our cordon."""
    return STILL_CORDONED if cordoned else UNTOUCHED


@dataclass(frozen=True)
class Rules:
    """What the settings allow: the policy and kubectl drain's flags."""

    policy: str
    restart_daemonsets: bool = False
    force: bool = False
    delete_emptydir_data: bool = False


def plan(holders: Sequence[Holder], pods: Sequence[Pod], *, node: str, rules: Rules,
         daemonset_exists: Callable[[Pod], bool], paused: Sequence[Pod] = (),
         undone: str = UNTOUCHED) -> Plan:
    """What to evict, delete or wait for, or UpgradeBlockedError naming every holder and
    pod we must not touch (all at once, so one rerun can fix them all). `paused`: pods the
    operator pause takes away (not planned here, but held to the emptyDir rule); `undone`:
    what the refusal says of the node (a node our upgrade cordoned stays cordoned)."""
    result = Plan()
    chosen, blocked = _holders_pods(holders, pods, node, result.holders)
    away = {pod.uid for pod in paused}
    for pod in paused:  # the pause removes them: the emptyDir rule holds there too
        blocked += [f"DaemonSet pod {pod.ref} (its DaemonSet is paused on this node) {why}"
                    for why in emptydir_refusals(pod, rules, "the pause", "pause")]
    for pod in pods:
        if pod.ref in chosen or pod.done or pod.uid in away:
            continue
        if pod.gpu:
            chosen[pod.ref] = (pod, f"asks for {pod.gpu}")
        elif pod.driver:
            chosen[pod.ref] = (pod, pod.driver)
        elif rules.policy == "drain":
            chosen[pod.ref] = (pod, "UPGRADE_POLICY=drain")
    for pod, why in chosen.values():
        held = pod.ref in result.holders or pod.driver is not None
        action, refusals = _decide(pod, held=held, rules=rules,
                                   daemonset_exists=daemonset_exists)
        if refusals:
            kind = "static pod" if pod.mirror else "DaemonSet pod" if action == "delete" \
                else "pod"
            blocked.append(f"{kind} {pod.ref} ({why}) " + " and ".join(refusals))
        elif action:
            getattr(result, action).append(pod)
    if blocked:
        raise UpgradeBlockedError(
            "cannot free the GPUs: " + "; ".join(blocked)
            + f"; {undone}",
            remedy=_remedy(blocked))
    return result


def _holders_pods(holders: Sequence[Holder], pods: Sequence[Pod], node: str,
                  pids: dict[str, list[int]]
                  ) -> tuple[dict[str, tuple[Pod, str]], list[str]]:
    """The holders' pods (ref -> pod, why), filling `pids`; and the holders in no pod the
    API lists, which nothing but their owner can stop."""
    by_uid = {p.uid: p for p in pods} | {p.static_uid: p for p in pods if p.static_uid}
    chosen: dict[str, tuple[Pod, str]] = {}
    blocked = []
    for holder in holders:
        pod = by_uid.get(holder.pod.pod_uid) if holder.pod else None
        if holder.pod is None:
            blocked.append(f"process {holder.pid} ({holder.command}) is not in a pod")
        elif pod is None:
            blocked.append(f"process {holder.pid} ({holder.command}) is in pod "
                           f"{holder.pod.pod_uid}, which the API does not list on {node}")
        else:
            chosen.setdefault(pod.ref, (pod, f"process {holder.pid} ({holder.command}) "
                                             "holds /dev/nvidia*"))
            pids.setdefault(pod.ref, []).append(holder.pid)
    return chosen, blocked


def _decide(pod: Pod, *, held: bool, rules: Rules, daemonset_exists: Callable[[Pod], bool]
            ) -> tuple[str | None, list[str]]:
    """(`evict`, `delete`, `wait` or None to leave it, the refusals that block it)."""
    if pod.mirror:  # the API cannot evict it; only one that uses the GPUs is in the way
        return None, ["cannot be evicted"] if held or pod.gpu else []
    if pod.terminating:
        return "wait", []
    if pod.done:
        return "evict", []
    orphan = pod.daemonset and not daemonset_exists(pod)
    if pod.daemonset and not orphan:
        if not held:
            return None, []  # its controller would recreate it at once: left alone
        refusals = [] if rules.restart_daemonsets else [
            f"is recreated at once by its controller (set {RESTART_DAEMONSETS} to delete it)"]
        return "delete", refusals + emptydir_refusals(pod, rules, "deleting it", "delete")
    refusals = []
    if (pod.owner_kind is None or orphan) and not rules.force:
        what = f"its DaemonSet {pod.owner_name} is gone" if orphan else "it has no controller"
        refusals.append(f"is not recreated by any controller ({what}; set {FORCE} to "
                        "evict it)")
    return "evict", refusals + emptydir_refusals(pod, rules, "eviction", "evict")


def emptydir_refusals(pod: Pod, rules: Rules, how: str, verb: str) -> list[str]:
    """kubectl drain's emptyDir rule, on every way a pod is made to go (eviction, deletion,
    a paused DaemonSet): its emptyDir data goes with it, so only with the setting."""
    if not pod.empty_dirs or rules.delete_emptydir_data:
        return []
    return [f"has emptyDir volume(s) {', '.join(pod.empty_dirs)}, whose data {how} "
            f"deletes (set {EMPTYDIR} to {verb} it)"]


def _remedy(blocked: Sequence[str]) -> str:
    if any(FORCE in b or EMPTYDIR in b for b in blocked):
        return ("set the named setting if losing those pods (or their emptyDir data) is "
                "acceptable, or delete them yourself (kubectl delete pod -n NAMESPACE NAME), "
                "then rerun")
    return UpgradeBlockedError.default_remedy
