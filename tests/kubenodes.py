"""The fake API server's Node (tests/kubefake.py): merge patches with optimistic concurrency
on resourceVersion, and the status subresource the GPU health conditions are patched on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubedocs import Doc, merge_patch, validate
from kubepods import _daemonsets_reconcile
from kubesmp import SMP, PatchRefused, strategic_merge

if TYPE_CHECKING:
    from kubefake import Cluster


def _status(code: int, message: str) -> Doc:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "message": message}


def _node(cluster: Cluster, method: str, name: str, body: Doc | None, content_type: str
          ) -> tuple[int, Doc, Doc | None]:
    if name not in cluster.nodes:
        return 404, _status(404, f"nodes {name} not found"), body
    if method == "GET":
        return 200, _versioned(cluster.nodes[name]), None
    if method != "PATCH" or content_type != "application/merge-patch+json":
        cluster.errors.append(f"{method} node with {content_type}")
        return 415, _status(415, "unsupported"), body
    stored = _versioned(cluster.nodes[name])
    patched = merge_patch(stored, body)
    if patched["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
        return 409, _status(409, f'Operation cannot be fulfilled on nodes "{name}": '
                                 f"{OPTIMISTIC_LOCK}"), body
    validate(patched)
    cluster.nodes[name] = _bump(patched)
    _daemonsets_reconcile(cluster)
    return 200, patched, body


# --- resourceVersion: optimistic concurrency on the Node -----------------------------------
# Every write gives the Node a new resourceVersion. A patch that carries
# `metadata.resourceVersion` writes only if it is still the stored one, else 409 Conflict
# with the API's message: kubernetes/kubernetes@f565665e0604a5aebe7116339096b961becf7e23,
# staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go (Store.Update:
# `newResourceVersion != existingResourceVersion` -> NewConflict(OptimisticLockErrorMsg));
# a merge patch without one is applied to the current object unconditionally (patch.go).
OPTIMISTIC_LOCK = ("the object has been modified; please apply your changes to the latest "
                   "version and try again")


def _versioned(node: Doc) -> Doc:
    """The Node with a resourceVersion (nodes built by node_doc start without one)."""
    node["metadata"].setdefault("resourceVersion", "1")
    return node


def _bump(node: Doc) -> Doc:
    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
    return node


# --- The Node's status subresource (GPU health conditions) ---------------------------------
# PATCH /api/v1/nodes/<n>/status with a strategic merge patch (tests/kubesmp.py), as
# kubelet and node-problem-detector send theirs: only `status` may be patched. Anything
# else (another content type, another directive, a condition without `type`) is refused
# and recorded.

def _node_status(cluster: Cluster, method: str, name: str, body: Doc | None,
                 content_type: str) -> tuple[int, Doc, Doc | None]:
    if name not in cluster.nodes:
        return 404, _status(404, f"nodes {name} not found"), body
    if method == "GET":
        return 200, cluster.nodes[name], None
    if method != "PATCH" or content_type != SMP:
        cluster.errors.append(f"{method} node status with {content_type}")
        return 415, _status(415, "unsupported"), body
    if not isinstance(body, dict) or set(body) != {"status"}:
        cluster.errors.append(f"node status patch touches more than status: {body}")
        return 400, _status(400, "only status may be patched here"), body
    try:
        patched = strategic_merge(cluster.nodes[name], body)
    except PatchRefused as exc:
        cluster.errors.append(f"PATCH node status: {exc}")
        return 400, _status(400, str(exc)), body
    validate(patched)
    cluster.nodes[name] = _bump(_versioned(patched))
    return 200, patched, body


def conditions(cluster: Cluster, node: str | None = None) -> dict[str, Doc]:
    """The Node's status conditions by type."""
    found = cluster.nodes[node or cluster.node_name].get("status", {}).get("conditions", [])
    return {c["type"]: c for c in found}
