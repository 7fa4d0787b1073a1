"""Where the common custom resources keep their pod templates (multi-GPU work mostly lives in
these): LeaderWorkerSet, JobSet, Ray, the Kubeflow training jobs, KServe, Knative, NVIDIA's
NIMService and Argo Workflows.

KServe, NIMService and Argo hold no complete pod template: the PodSpec their controllers will
build is put together here from the parts the object gives (a model's container, the
template's container, the scheduling fields), so the same rules can judge it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from installer.compat.pods.template import Template, at, count, job_counts, plural


def leader_worker_set(document: Mapping[str, Any]) -> list[Template]:
    """Groups (spec.replicas) of `size` pods: one leader, size-1 workers; without a
    leaderTemplate the workerTemplate makes the leader too."""
    groups = count(at(document, "spec", "replicas"))
    groups = 1 if groups is None else groups
    lwt = at(document, "spec", "leaderWorkerTemplate")
    size = count(at(lwt, "size")) or 1
    base = "spec.leaderWorkerTemplate"
    leader, worker = at(lwt, "leaderTemplate"), at(lwt, "workerTemplate")
    found: list[Template] = []
    if isinstance(leader, Mapping):
        found.append(Template(f"{base}.leaderTemplate", at(leader, "spec"), groups,
                              f"{plural(groups, 'group')}, 1 leader each"))
        workers = size - 1
        if isinstance(worker, Mapping):
            found.append(Template(f"{base}.workerTemplate", at(worker, "spec"),
                                  groups * workers,
                                  f"{plural(groups, 'group')} x {plural(workers, 'worker')}"))
    elif isinstance(worker, Mapping):
        found.append(Template(f"{base}.workerTemplate", at(worker, "spec"), groups * size,
                              f"{plural(groups, 'group')} x {size} pods, leader included"))
    return found


def job_set(document: Mapping[str, Any]) -> list[Template]:
    """spec.replicatedJobs[i]: `replicas` Jobs, each running `parallelism` pods."""
    found: list[Template] = []
    jobs = at(document, "spec", "replicatedJobs")
    for index, job in enumerate(jobs if isinstance(jobs, list) else []):
        template = at(job, "template", "spec", "template")
        if not isinstance(template, Mapping):
            continue
        copies = count(at(job, "replicas"))
        copies = 1 if copies is None else copies
        parallelism, said = job_counts(at(job, "template", "spec"))
        name = at(job, "name")
        text = f"job {name}: " if isinstance(name, str) else ""
        text += f"replicas {copies}" + (f" x {said}" if said else "")
        found.append(Template(f"spec.replicatedJobs[{index}].template.spec.template",
                              at(template, "spec"), copies * parallelism, text))
    return found


def _ray_cluster(cluster: Any, base: str) -> list[Template]:
    """A Ray cluster spec: one head pod, and worker groups of replicas x numOfHosts pods."""
    found: list[Template] = []
    head = at(cluster, "headGroupSpec", "template")
    if isinstance(head, Mapping):
        found.append(Template(f"{base}.headGroupSpec.template", at(head, "spec"), 1, "head"))
    groups = at(cluster, "workerGroupSpecs")
    for index, group in enumerate(groups if isinstance(groups, list) else []):
        template = at(group, "template")
        if not isinstance(template, Mapping):
            continue
        counts = {f: count(at(group, f)) for f in ("replicas", "minReplicas", "maxReplicas",
                                                     "numOfHosts")}
        replicas = counts["replicas"] if counts["replicas"] is not None else \
            counts["minReplicas"] if counts["minReplicas"] is not None else 1
        hosts = counts["numOfHosts"] or 1
        name = at(group, "groupName")
        said = [f"{f} {v}" for f, v in counts.items() if v is not None]
        text = (f"group {name}: " if isinstance(name, str) else "") + \
            (", ".join(said) or "replicas 1")
        found.append(Template(f"{base}.workerGroupSpecs[{index}].template",
                              at(template, "spec"), replicas * hosts, text))
    return found


def ray(field: str) -> Callable[[Mapping[str, Any]], list[Template]]:
    """RayCluster (spec), RayService (spec.rayClusterConfig), RayJob (spec.rayClusterSpec and
    the optional submitter pod)."""
    def find(document: Mapping[str, Any]) -> list[Template]:
        base = f"spec.{field}" if field else "spec"
        found = _ray_cluster(at(document, "spec", *([field] if field else [])), base)
        submitter = at(document, "spec", "submitterPodTemplate")
        if field == "rayClusterSpec" and isinstance(submitter, Mapping):
            found.append(Template("spec.submitterPodTemplate", at(submitter, "spec"), 1,
                                  "submitter"))
        return found
    return find


def kubeflow(document: Mapping[str, Any]) -> list[Template]:
    """PyTorchJob, TFJob, MPIJob, XGBoostJob, PaddleJob, JAXJob: spec.<x>ReplicaSpecs.<Role>
    each with replicas (default 1) and a template."""
    found: list[Template] = []
    spec = at(document, "spec")
    for field, roles in (spec.items() if isinstance(spec, Mapping) else ()):
        if not (isinstance(field, str) and field.endswith("ReplicaSpecs")
                and isinstance(roles, Mapping)):
            continue
        for role, replica_spec in roles.items():
            template = at(replica_spec, "template")
            if not isinstance(template, Mapping):
                continue
            replicas = count(at(replica_spec, "replicas"))
            found.append(Template(f"spec.{field}.{role}.template", at(template, "spec"),
                                  1 if replicas is None else replicas,
                                  f"replicas {1 if replicas is None else replicas}"))
    return found


# KServe: a component (predictor, transformer, explainer) is a PodSpec inline, plus a model
# (or a framework shorthand) whose fields are the serving container's.
KSERVE_COMPONENTS = ("predictor", "transformer", "explainer")
KSERVE_MODELS = ("model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx",
                 "huggingface", "lightgbm", "paddle", "pmml", "alibi", "art")
KSERVE_NOT_CONTAINER = frozenset({"modelFormat", "runtime", "runtimeVersion", "storageUri",
                                  "storage", "protocolVersion", "name"})
KSERVE_NOT_POD = frozenset({*KSERVE_MODELS, "minReplicas", "maxReplicas", "scaleTarget",
                            "scaleMetric", "containerConcurrency", "timeout",
                            "canaryTrafficPercent", "logger", "batcher", "labels",
                            "annotations", "deploymentStrategy", "autoScaling", "workerSpec",
                            "containers"})


def kserve(document: Mapping[str, Any]) -> list[Template]:
    """InferenceService: each component's pod (the model's container first, as KServe names
    it `kserve-container`), and a multi-node predictor's worker pods (`workerSpec`)."""
    found: list[Template] = []
    for name in KSERVE_COMPONENTS:
        component = at(document, "spec", name)
        if not isinstance(component, Mapping):
            continue
        listed = component.get("containers")
        containers = list(listed) if isinstance(listed, list) else []
        model = next((component[m] for m in KSERVE_MODELS
                      if isinstance(component.get(m), Mapping)), None)
        if model is not None:
            containers.insert(0, {"name": "kserve-container", **{
                k: v for k, v in model.items() if k not in KSERVE_NOT_CONTAINER}})
        if not containers:
            continue
        pod = {k: v for k, v in component.items() if k not in KSERVE_NOT_POD}
        least, most = (count(component.get(f)) for f in ("minReplicas", "maxReplicas"))
        said = [f"{f} {v}" for f, v in (("minReplicas", least), ("maxReplicas", most))
                if v is not None]
        found.append(Template(f"spec.{name}", {**pod, "containers": containers},
                              1 if least is None else least, ", ".join(said)))
        worker = component.get("workerSpec")
        if isinstance(worker, Mapping):
            sizes = [f"{f} {v}" for f in ("pipelineParallelSize", "tensorParallelSize")
                     if (v := count(worker.get(f))) is not None]
            found.append(Template(f"spec.{name}.workerSpec", {
                k: v for k, v in worker.items()
                if k not in ("pipelineParallelSize", "tensorParallelSize")},
                None, ", ".join(sizes) or "workers"))
    return found


def knative(document: Mapping[str, Any]) -> list[Template]:
    """Knative Service and Configuration: spec.template, scaled by its autoscaling
    annotations (`autoscaling.knative.dev/min-scale`; Knative's default minimum is 0)."""
    template = at(document, "spec", "template")
    if not isinstance(template, Mapping):
        return []
    notes = at(template, "metadata", "annotations")
    scale = {key: int(value) for key in ("min-scale", "max-scale", "initial-scale")
             if isinstance(value := at(notes, f"autoscaling.knative.dev/{key}"), str)
             and value.isascii() and value.isdecimal() and len(value) < 10}
    return [Template("spec.template", at(template, "spec"), scale.get("min-scale"),
                     ", ".join(f"{key} {value}" for key, value in scale.items()))]


# NVIDIA's NIM Operator: the container is described field by field in the spec.
NIM_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "runtimeClassName",
                  "schedulerName", "priorityClassName")


def nim_service(document: Mapping[str, Any]) -> list[Template]:
    """NIMService: one container from spec.image, resources, env, command and args, with the
    spec's scheduling fields; spec.replicas (default 1) pods, or what its autoscaler allows."""
    spec = at(document, "spec")
    if not isinstance(spec, Mapping):
        return []
    name = at(document, "metadata", "name")
    container: dict[str, Any] = {"name": name if isinstance(name, str) else "nim"}
    repository, tag = at(spec, "image", "repository"), at(spec, "image", "tag")
    if isinstance(repository, str):
        container["image"] = f"{repository}:{tag}" if isinstance(tag, str | int) else repository
    container.update({f: spec[f] for f in ("resources", "env", "command", "args") if f in spec})
    pod = {f: spec[f] for f in NIM_POD_FIELDS if f in spec}
    replicas = count(spec.get("replicas"))
    said = [f"replicas {replicas}"] if replicas is not None else []
    if at(spec, "scale", "enabled") is True:
        said += [f"{f} {v}" for f in ("minReplicas", "maxReplicas")
                 if (v := count(at(spec, "scale", "hpa", f))) is not None]
    return [Template("spec", {**pod, "containers": [container]},
                     1 if replicas is None else replicas, ", ".join(said))]


# Argo: a template that runs a pod gives one container (`container`, `script`) or several
# (`containerSet`), plus sidecars; scheduling fields come from the template, else from the
# workflow (a template's nodeSelector adds to and overrides the workflow's).
ARGO_POD_FIELDS = ("tolerations", "affinity", "schedulerName", "priorityClassName",
                   "securityContext", "serviceAccountName", "imagePullSecrets", "hostNetwork",
                   "dnsPolicy", "runtimeClassName", "volumes")


def argo(document: Mapping[str, Any]) -> list[Template]:
    """Workflow, WorkflowTemplate, ClusterWorkflowTemplate (spec) and CronWorkflow
    (spec.workflowSpec): one pod per template that runs a container."""
    base = "spec.workflowSpec" if document.get("kind") == "CronWorkflow" else "spec"
    workflow = at(document, *base.split("."))
    listed = at(workflow, "templates")
    found: list[Template] = []
    for index, template in enumerate(listed if isinstance(listed, list) else []):
        containers = _argo_containers(template)
        if not containers:
            continue
        pod: dict[str, Any] = {f: template.get(f, at(workflow, f)) for f in ARGO_POD_FIELDS
                               if template.get(f, at(workflow, f)) is not None}
        selectors = [s for s in (at(workflow, "nodeSelector"), template.get("nodeSelector"))
                     if isinstance(s, Mapping)]
        if selectors:
            pod["nodeSelector"] = {k: v for s in selectors for k, v in s.items()}
        if isinstance(template.get("initContainers"), list):
            pod["initContainers"] = template["initContainers"]
        name = template.get("name")
        found.append(Template(f"{base}.templates[{index}]", {**pod, "containers": containers},
                              None, f"template {name}" if isinstance(name, str) else ""))
    return found


def _argo_containers(template: Any) -> list[Any]:
    if not isinstance(template, Mapping):
        return []
    containers: list[Any] = []
    for field in ("container", "script"):
        if isinstance(template.get(field), Mapping):
            main = {k: v for k, v in template[field].items() if k != "source"}
            containers.append({**main, "name": "main"})
    listed = at(template, "containerSet", "containers")
    if isinstance(listed, list):
        containers.extend(listed)
    if containers and isinstance(template.get("sidecars"), list):
        containers.extend(template["sidecars"])
    return containers
