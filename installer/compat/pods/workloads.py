"""Read workloads from YAML or JSON and find the PodSpec in each (for `check-pod`).

The input is bounded (a workload is a few KiB; the API server stores at most ~1.5 MiB), parsed
with a safe loader only, and every refusal is one line naming the document and what is wrong.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import ConfigError

MAX_BYTES = 4 * 1024 * 1024
# kind -> where its PodSpec is
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "PodTemplate": ("template", "spec"),
}
KINDS_TEXT = ", ".join(POD_SPEC_PATHS)


class WorkloadError(ConfigError):
    """The input is not YAML/JSON, too large, or holds no valid workload (exit 2)."""


@dataclass(frozen=True)
class Workload:
    """One PodSpec of a document and what names it in a report.

    An object may hold several pod templates (a LeaderWorkerSet's leader and workers, each
    worker group of a RayCluster): each is its own Workload, told apart by `path`.
    """

    document: int
    kind: str
    name: str
    namespace: str | None
    spec: Mapping[str, Any]
    path: str = ""                  # where the template is, e.g. "spec.template"; "" for a Pod
    replicas: int | None = None     # how many pods of this template the object asks for
    multiplicity: str = ""          # how the object says so, e.g. "parallelism 4"

    @property
    def title(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        title = f"{self.kind}/{where}{self.name}"
        if self.path:
            title += f" {self.path}"
        if self.multiplicity:
            title += f" ({self.multiplicity})"
        elif self.replicas is not None:
            title += f" (x{self.replicas})"
        return title


@dataclass(frozen=True)
class Documents:
    """The workloads of an input, the documents skipped as not workloads, one line per
    document that could not be read (`problems`), and every parsed document that is not a
    workload (`others`: ResourceClaims, DeviceClasses, Nodes) for the rules that need them."""

    workloads: tuple[Workload, ...]
    skipped: tuple[str, ...]
    problems: tuple[str, ...] = ()
    others: tuple[Mapping[str, Any], ...] = ()

    @property
    def checkable(self) -> bool:
        """Whether anything can be judged; when not, the command exits 2 (the input is bad)."""
        return bool(self.workloads)


def read_input(source: str) -> bytes:
    """The bytes of FILE, or of stdin for `-`, refusing more than MAX_BYTES."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            with Path(source).open("rb") as handle:
                data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise WorkloadError(f"cannot read {source}: {exc.strerror or exc}",
                            remedy="give a readable YAML or JSON file, or - for stdin") from None
    if len(data) > MAX_BYTES:
        raise WorkloadError(f"{source} is larger than {MAX_BYTES // (1024 * 1024)} MiB",
                            remedy="give the workload's own manifest (a few KiB)")
    return data


def parse(data: bytes, source: str) -> Documents:
    """Every document of a YAML/JSON stream; `kind: List` is unpacked."""
    import yaml  # type: ignore[import-untyped]  # only check-pod needs it

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # both are safe loaders
    try:
        documents = [d for d in yaml.load_all(data, Loader=loader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise WorkloadError(f"{source} is not valid YAML or JSON{where}: {problem}",
                            remedy="fix the syntax (`kubectl apply --dry-run=client -f` "
                                   "shows it too)") from None
    except (RecursionError, MemoryError):
        raise WorkloadError(f"{source} is nested too deeply to be a workload",
                            remedy="give the workload's own manifest") from None
    workloads: list[Workload] = []
    skipped: list[str] = []
    for index, document in _flatten(documents):
        found = workload(document, index, source)
        if found is None:
            skipped.append(_describe(document))
        else:
            workloads.append(found)
    if not workloads:
        what = f" (found {', '.join(skipped)})" if skipped else ""
        raise WorkloadError(f"{source} holds no workload{what}",
                            remedy=f"give a manifest of kind {KINDS_TEXT}")
    return Documents(tuple(workloads), tuple(skipped))


def _flatten(documents: list[Any]) -> Iterator[tuple[int, Any]]:
    for number, document in enumerate(documents, start=1):
        if isinstance(document, dict) and document.get("kind") == "List" \
                and isinstance(document.get("items"), list):
            for item in document["items"]:
                yield number, item
        else:
            yield number, document


def _describe(document: Any) -> str:
    if not isinstance(document, dict):
        return type(document).__name__
    name = (document.get("metadata") or {}).get("name") if isinstance(
        document.get("metadata"), dict) else None
    return f"{document.get('kind')}/{name}" if name else str(document.get("kind"))


def workload(document: Any, index: int, source: str) -> Workload | None:
    """The PodSpec of one document; None for an object of another kind (a Service)."""
    where = f"{source} document {index}"
    if not isinstance(document, dict):
        raise WorkloadError(f"{where} is a {type(document).__name__}, not a Kubernetes object",
                            remedy="each document must be a mapping with apiVersion and kind")
    kind = document.get("kind")
    if not isinstance(kind, str) or not isinstance(document.get("apiVersion"), str):
        raise WorkloadError(f"{where} has no apiVersion or kind",
                            remedy="give Kubernetes manifests (apiVersion, kind, metadata, "
                                   "spec)")
    path = POD_SPEC_PATHS.get(kind)
    if path is None:
        return None
    node: Any = document
    for step in path:
        node = node.get(step) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise WorkloadError(f"{where} ({kind}) has no {'.'.join(path)}",
                            remedy=f"a {kind} holds its PodSpec at {'.'.join(path)}")
    containers = node.get("containers")
    if not isinstance(containers, list) or not containers or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in containers):
        raise WorkloadError(f"{where} ({kind}) has no list of named containers",
                            remedy="the PodSpec needs containers: [{name: ..., image: ...}]")
    found = document.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
    namespace = metadata.get("namespace")
    return Workload(index, kind, str(name), str(namespace) if namespace else None, node)
