"""Where a Kubernetes object keeps its pod templates, and how many pods each one makes.

The built-in kinds and the common custom resources are known by name (multi-GPU work mostly
lives in LeaderWorkerSets, JobSets, Ray and Kubeflow jobs); any other kind is searched for the
shape of a pod template (a mapping whose `spec.containers` is a list). Each template found is
named by its path in the object, the way `kubectl explain` would name it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from installer.compat.pods import crds
from installer.compat.pods.template import ShapeError, Template, at, count, job_counts

# A generic search looks at no more than this many nodes of one object, and no deeper: real
# manifests have a few thousand; YAML aliases can make a small file look endless.
MAX_NODES = 20_000
MAX_DEPTH = 64
# API groups whose objects hold container *patterns* (policies, schemas), never pods to run.
PATTERN_GROUPS = frozenset({
    "kyverno.io", "wgpolicyk8s.io", "templates.gatekeeper.sh", "constraints.gatekeeper.sh",
    "mutations.gatekeeper.sh", "admissionregistration.k8s.io", "apiextensions.k8s.io"})
# Fields of the object that say how many pods a template makes, in the order shown.
COUNT_FIELDS = ("replicas", "parallelism", "completions", "minReplicas", "maxReplicas",
                "size", "numOfHosts")


def templates(document: Mapping[str, Any]) -> list[Template]:
    """Every pod template of an object; [] for one that holds none (a Service, a Node)."""
    kind = str(document.get("kind"))
    group = str(document.get("apiVersion", "")).rpartition("/")[0]
    groups, finder = KNOWN.get(kind, (frozenset(), None))
    if finder is not None and (group in groups or "" in groups
                               or (not group and kind in BUILT_IN)):
        return finder(document)
    if group in PATTERN_GROUPS:
        return []
    return list(search(document))


def _required(document: Mapping[str, Any], *steps: str) -> Any:
    """The PodSpec of a built-in kind, where the API server insists it is."""
    node = at(document, *steps)
    if not isinstance(node, Mapping):
        kind, where = document.get("kind"), ".".join(steps)
        raise ShapeError(f"({kind}) has no {where}", f"a {kind} holds its PodSpec at {where}")
    return node


def _pod(document: Mapping[str, Any]) -> list[Template]:
    return [Template("", _required(document, "spec"))]


def _pod_template(document: Mapping[str, Any]) -> list[Template]:
    return [Template("template", _required(document, "template", "spec"))]


def _replicated(document: Mapping[str, Any]) -> list[Template]:
    """Deployment, StatefulSet, ReplicaSet, ReplicationController: spec.replicas, default 1."""
    spec = _required(document, "spec", "template", "spec")
    written = count(at(document, "spec", "replicas"))
    return [Template("spec.template", spec, 1 if written is None else written,
                     "" if written is None else f"replicas {written}")]


def _daemon_set(document: Mapping[str, Any]) -> list[Template]:
    spec = _required(document, "spec", "template", "spec")
    return [Template("spec.template", spec, None, "one per node")]


def _job(document: Mapping[str, Any]) -> list[Template]:
    spec = _required(document, "spec", "template", "spec")
    replicas, said = job_counts(document.get("spec"))
    return [Template("spec.template", spec, replicas, said)]


def _cron_job(document: Mapping[str, Any]) -> list[Template]:
    spec = _required(document, "spec", "jobTemplate", "spec", "template", "spec")
    replicas, said = job_counts(at(document, "spec", "jobTemplate", "spec"))
    return [Template("spec.jobTemplate.spec.template", spec, replicas, said)]


# kind -> (API groups it is known under; "" matches any), where its templates are
KNOWN: dict[str, tuple[frozenset[str], Callable[[Mapping[str, Any]], list[Template]]]] = {
    "Pod": (frozenset({""}), _pod),
    "PodTemplate": (frozenset({""}), _pod_template),
    "Deployment": (frozenset({"apps", "extensions"}), _replicated),
    "StatefulSet": (frozenset({"apps"}), _replicated),
    "ReplicaSet": (frozenset({"apps", "extensions"}), _replicated),
    "ReplicationController": (frozenset({""}), _replicated),
    "DaemonSet": (frozenset({"apps", "extensions"}), _daemon_set),
    "Job": (frozenset({"batch"}), _job),
    "CronJob": (frozenset({"batch"}), _cron_job),
    "LeaderWorkerSet": (frozenset({"leaderworkerset.x-k8s.io"}), crds.leader_worker_set),
    "JobSet": (frozenset({"jobset.x-k8s.io"}), crds.job_set),
    "RayCluster": (frozenset({"ray.io"}), crds.ray("")),
    "RayService": (frozenset({"ray.io"}), crds.ray("rayClusterConfig")),
    "RayJob": (frozenset({"ray.io"}), crds.ray("rayClusterSpec")),
    **{kind: (frozenset({"kubeflow.org"}), crds.kubeflow) for kind in (
        "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "MXJob", "JAXJob")},
    "InferenceService": (frozenset({"serving.kserve.io"}), crds.kserve),
    **{kind: (frozenset({"serving.knative.dev"}), crds.knative) for kind in (
        "Service", "Configuration")},
    "NIMService": (frozenset({"apps.nvidia.com"}), crds.nim_service),
    **{kind: (frozenset({"argoproj.io"}), crds.argo) for kind in (
        "Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")},
}
KINDS_TEXT = ("a Pod, a workload (Deployment, StatefulSet, DaemonSet, Job, CronJob...) or a "
              "custom resource holding one (LeaderWorkerSet, JobSet, RayCluster, PyTorchJob, "
              "InferenceService, Workflow...)")
# Kubernetes' own kinds: the API server validates their PodSpecs (container names included).
BUILT_IN = frozenset(("Pod", "PodTemplate", "Deployment", "StatefulSet", "ReplicaSet",
                      "ReplicationController", "DaemonSet", "Job", "CronJob"))


def is_pod_spec(node: Any) -> bool:
    """The shape of a PodSpec: a non-empty list of container mappings under `containers`."""
    containers = node.get("containers") if isinstance(node, Mapping) else None
    return isinstance(containers, list) and bool(containers) and all(
        isinstance(c, Mapping) for c in containers)


def search(document: Mapping[str, Any]) -> Iterator[Template]:
    """Every PodSpec-shaped mapping in an object of a kind not known by name, in document
    order, bounded in nodes and depth. A PodSpec under `spec` names its template (the parent);
    the mapping holding the template says how many pods it makes."""
    # (node, its path, its depth, its parent, its grandparent)
    stack: list[tuple[Any, str, int, Any, Any]] = [(document, "", 0, None, None)]
    visited = 0
    while stack and visited < MAX_NODES:
        node, path, depth, parent, grandparent = stack.pop()
        visited += 1
        if isinstance(node, Mapping):
            if depth and is_pod_spec(node):
                yield _generic(node, path, parent, grandparent)
                continue
            children = [(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()
                        if depth or k not in ("metadata", "status")]
        elif isinstance(node, list):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(node)]
        else:
            continue
        if depth < MAX_DEPTH:
            stack.extend((v, p, depth + 1, node, parent) for v, p in reversed(children)
                         if isinstance(v, Mapping | list))


def _generic(spec: Mapping[str, Any], path: str, parent: Any, grandparent: Any) -> Template:
    # a PodSpec inline may carry its counts itself (as KServe's components do)
    holders: tuple[Any, ...] = (spec, parent)
    if path == "spec" or path.endswith(".spec"):
        # the template itself (Seldon's `{replicas, spec}`) or what holds it (`{replicas,
        # template}`) says how many
        path, holders = path.removesuffix("spec").removesuffix("."), (parent, grandparent)
    counts = [(f, next((n for h in holders if (n := count(at(h, f))) is not None), None))
              for f in COUNT_FIELDS]
    said = [f"{f} {v}" for f, v in counts if v is not None]
    replicas = next((v for f, v in counts if v is not None and f in (
        "replicas", "parallelism", "minReplicas")), None)
    return Template(path, spec, replicas, ", ".join(said))
