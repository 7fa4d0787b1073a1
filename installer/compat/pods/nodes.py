"""`--node-labels FILE`: the node(s) a workload should run on, as `kubectl get node NAME -o
yaml` (labels, taints, allocatable) or `kubectl get nodes -o yaml` (a List: each node is
judged, like a scheduler dry run) prints them, or a plain mapping of labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from installer.compat.pods import fields
from installer.compat.pods.rules import NodeView
from installer.compat.pods.workloads import WorkloadError
from installer.node.documents import read_yaml, show

_REMEDY = "give `kubectl get node NAME -o yaml` (or `get nodes`) output or a mapping of labels"


def node_views_from_document(data: bytes, source: str, driver: str | None) -> \
        tuple[NodeView, ...]:
    """Every node the file describes: a Node, a List of Nodes, or a mapping of labels."""
    import yaml  # type: ignore[import-untyped]

    try:
        documents = read_yaml(data, name=f"--node-labels {source}", error=WorkloadError)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        raise WorkloadError(f"--node-labels {source} is not valid YAML or JSON: "
                            f"{show(getattr(exc, 'problem', None) or type(exc).__name__)}",
                            remedy=_REMEDY) from None
    if len(documents) > 1:
        raise WorkloadError(f"--node-labels {source} holds {len(documents)} documents, not one",
                            remedy=_REMEDY)
    document = documents[0] if documents else None
    if isinstance(document, dict) and document.get("kind") == "List" \
            and isinstance(document.get("items"), list) and document["items"]:
        items = document["items"]
        if not all(isinstance(i, dict) and i.get("kind") == "Node" for i in items):
            raise WorkloadError(f"--node-labels {source} is a List that holds more than "
                                "Nodes", remedy=_REMEDY)
        return tuple(_node(item, source, driver) for item in items)
    if isinstance(document, dict) and document.get("kind") == "Node":
        return (_node(document, source, driver),)
    if not isinstance(document, dict) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool)
            for v in document.values()):
        raise WorkloadError(f"--node-labels {source} is neither a Node nor a mapping of labels",
                            remedy=_REMEDY)
    labels = {str(k): str(v) for k, v in document.items()}
    return (NodeView(labels, None, driver, f"--node-labels {source}"),)


def node_view_from_document(data: bytes, source: str, driver: str | None) -> NodeView:
    """The one node a file describes (the first, if it lists several)."""
    return node_views_from_document(data, source, driver)[0]


def _mapping(found: Any) -> dict[str, Any]:
    return found if isinstance(found, dict) else {}


def _node(document: Mapping[str, Any], source: str, driver: str | None) -> NodeView:
    """One Node document: its labels, NoSchedule/NoExecute taints and allocatable, each
    of the type the API gives it (a Node whose fields are of other types is refused)."""
    metadata, spec = _mapping(document.get("metadata")), _mapping(document.get("spec"))
    name = str(metadata.get("name") or "(unnamed)")
    wrong = fields.node_problem(document)
    if wrong is not None:
        raise WorkloadError(f"--node-labels {source}: Node {name}: {wrong.path} {wrong.why}",
                            remedy=wrong.fix)
    labels = _mapping(metadata.get("labels"))
    found = spec.get("taints") or []
    taints = tuple(t for t in found if isinstance(t, dict)) if isinstance(found, list) else ()
    raw = _mapping(document.get("status")).get("allocatable")
    allocatable = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else None
    return NodeView({str(k): str(v) for k, v in labels.items()}, taints, driver,
                    f"--node-labels {source}", name, allocatable)
