"""Kubernetes documents for the strict fake API (tests/kubefake.py): its schema check, the
objects it serves, the Status of a refusal, and a merge patch applied as the API server does.

Every builder validates what it returns against the schemas kubernetes-validate bundles for
VERSION, strictly (an unknown or misspelt field fails), so a test cannot hand the installer
an object a real API server would never serve.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

VERSION = "1.33.0"
Doc = dict[str, Any]


def validate(doc: Doc) -> None:
    """Strictly valid for Kubernetes VERSION (an unknown or misspelt field fails)."""
    kubernetes_validate.validate(doc, VERSION, strict=True)


def validate_delete_options(doc: Doc) -> None:
    """meta/v1 DeleteOptions (kubernetes-validate has no kind lookup for it)."""
    directory = f"kubernetes-json-schema/v{VERSION}-local-strict"
    schema = schema_contents(f"{directory}/deleteoptions-meta-v1.json", VERSION)
    defs = schema_contents(f"{directory}/_definitions.json", VERSION)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(doc)


def node_doc(name: str, labels: dict[str, str] | None = None, *, ready: bool = True,
             cordoned: bool = False) -> Doc:
    """A Node as the API serves it: Ready unless `ready=False` (the kubelet stopped
    reporting), cordoned by someone else with `cordoned=True`."""
    doc: Doc = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": f"uid-{name}",
                             "labels": dict(labels or {})},
                "spec": {"unschedulable": True} if cordoned else {},
                "status": {"conditions": [{
                    "type": "Ready", "status": "True" if ready else "Unknown",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown"}]}}
    validate(doc)
    return doc


def pod_doc(name: str, uid: str, node: str, *, namespace: str = "default",
            owner: str | None = "ReplicaSet", annotations: dict[str, str] | None = None,
            phase: str = "Running", limits: dict[str, str] | None = None,
            init_limits: dict[str, str] | None = None, empty_dirs: tuple[str, ...] = (),
            claim: str | None = None, grace: int | None = None) -> Doc:
    """A valid Pod: `limits` for its container (`init_limits`: an init container's),
    `empty_dirs` volumes, a DRA `claim` (a ResourceClaim's name), its `grace` period."""
    metadata: Doc = {"name": name, "namespace": namespace, "uid": uid}
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1" if owner != "Node" else "v1",
                                        "kind": owner, "name": f"{name}-owner",
                                        "uid": f"owner-{uid}", "controller": True}]
    if annotations:
        metadata["annotations"] = annotations
    main: Doc = {"name": "main", "image": "cuda:12"}
    spec: Doc = {"nodeName": node, "containers": [main]}
    if limits:
        main["resources"] = {"limits": limits}
    if init_limits:
        spec["initContainers"] = [{"name": "warm-up", "image": "cuda:12",
                                   "resources": {"limits": init_limits}}]
    if empty_dirs:
        spec["volumes"] = [{"name": v, "emptyDir": {}} for v in empty_dirs]
        main["volumeMounts"] = [{"name": v, "mountPath": f"/{v}"} for v in empty_dirs]
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        main.setdefault("resources", {})["claims"] = [{"name": "gpu"}]
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
           "status": {"phase": phase}}
    validate(doc)
    return doc


def daemonset_doc(name: str, namespace: str = "default") -> Doc:
    """A valid apps/v1 DaemonSet (what GET answers for a pod's controller)."""
    labels = {"app": name}
    doc = {"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"name": name, "namespace": namespace, "uid": f"ds-{name}"},
           "spec": {"selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels},
                                 "spec": {"containers": [{"name": "main",
                                                          "image": "agent:1"}]}}}}
    validate(doc)
    return doc


def namespace_terminating(namespace: str, name: str) -> Doc:
    """What the NamespaceLifecycle admission plugin answers to a create in a namespace
    being deleted (an eviction is a create of the pods/eviction subresource)."""
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 403,
            "reason": "Forbidden",
            "message": f'pods "{name}" is forbidden: unable to create new content in '
                       f"namespace {namespace} because it is being terminated",
            "details": {"name": name, "kind": "pods", "causes": [
                {"reason": "NamespaceTerminating", "field": "metadata.namespace",
                 "message": f"namespace {namespace} is being terminated"}]}}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: what the API server does with application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
