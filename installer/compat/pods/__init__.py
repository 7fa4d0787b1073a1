"""`check-pod`: will this workload's PodSpec run on this node, rule by rule?

Reads Pods and workloads whose template holds a PodSpec (`workloads`), judges each with the
rules people trip over (`rules`), and reports pass/fail/skip with why and the fix. Needs no
root and no node unless the caller gives it this node's labels or driver.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from installer.compat.pods import rules
from installer.compat.pods.rules import FAIL, GPU, NodeView, RuleResult
from installer.compat.pods.workloads import Documents, Workload, WorkloadError, parse
from installer.compat.toolkit import parse_cuda, parse_driver
from installer.errors import IncompatibleError

__all__ = ["NodeView", "PodCheckFailedError", "PodReport", "WorkloadError", "check",
           "node_view_from_document", "parse"]


class PodCheckFailedError(IncompatibleError):
    """A rule fails: the workload would not get a GPU on this node, or not run there."""


@dataclass(frozen=True)
class WorkloadReport:
    """Every rule's result for one workload."""

    workload: Workload
    results: tuple[RuleResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.status != FAIL for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        return {"document": w.document, "kind": w.kind, "name": w.name,
                "namespace": w.namespace, "passed": self.passed,
                "rules": [asdict(r) for r in self.results]}


@dataclass(frozen=True)
class PodReport:
    """The `check-pod` result for a whole input."""

    source: str
    workloads: tuple[WorkloadReport, ...]
    skipped: tuple[str, ...]
    node: NodeView

    @property
    def passed(self) -> bool:
        return all(w.passed for w in self.workloads)

    def failures(self) -> list[str]:
        return [f"{w.workload.title}: {r.rule}" for w in self.workloads for r in w.results
                if r.status == FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "passed": self.passed,
                "node": {"labels_from": self.node.source or None,
                         "driver": self.node.driver},
                "workloads": [w.to_dict() for w in self.workloads],
                "skipped": list(self.skipped)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = []
        for report in self.workloads:
            lines.append(f"{report.workload.title} (document {report.workload.document}):")
            for r in report.results:
                fix = f"; fix: {r.fix}" if r.fix and r.status != "pass" else ""
                lines.append(f"  {r.status.upper():<4}  {r.rule:<10}  {r.why}{fix}")
        lines += [f"skipped: {what} (no PodSpec)" for what in self.skipped]
        failed = self.failures()
        lines.append(f"result: {len(failed)} rule(s) fail" + (
            f" ({', '.join(failed)})" if failed else f" in {len(self.workloads)} workload(s)"))
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        """Exit 14 after the report is printed, so scripts can branch on it."""
        failed = self.failures()
        if failed:
            raise PodCheckFailedError(f"{len(failed)} rule(s) fail: {', '.join(failed)}",
                                      remedy="apply each fix check-pod lists, then rerun it")


def check(documents: Documents, source: str, *, node: NodeView, cuda: str | None = None,
          resources: Sequence[str] = ()) -> PodReport:
    """Judge every workload; `resources` adds extended resources checked like the GPU."""
    if cuda is not None:
        parse_cuda(cuda)
    if node.driver is not None:
        parse_driver(node.driver)
    names = (GPU, *(r for r in resources if r != GPU))
    reports = []
    for workload in documents.workloads:
        spec = workload.spec
        wants_gpu = bool(rules.gpu_containers(spec, names))
        results = (rules.limits_rule(spec, names), rules.requests_rule(spec, names),
                   rules.whole_rule(spec, names), rules.toleration_rule(spec, node, wants_gpu),
                   rules.gpu_type_rule(spec, node), rules.cuda_rule(spec, names, node, cuda))
        reports.append(WorkloadReport(workload, results))
    return PodReport(source, tuple(reports), documents.skipped, node)


def node_view_from_document(data: bytes, source: str, driver: str | None) -> NodeView:
    """`--node-labels FILE`: a Node (as `kubectl get node NAME -o yaml` prints it, taints
    included), a List holding one, or a plain mapping of labels."""
    import yaml  # type: ignore[import-untyped]

    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise WorkloadError(f"--node-labels {source} is not valid YAML or JSON: "
                            f"{getattr(exc, 'problem', None) or type(exc).__name__}",
                            remedy="give `kubectl get node NAME -o yaml` output or a "
                                   "mapping of labels") from None
    if isinstance(document, dict) and document.get("kind") == "List" \
            and isinstance(document.get("items"), list) and len(document["items"]) == 1:
        document = document["items"][0]
    taints: tuple[Mapping[str, Any], ...] | None = None
    if isinstance(document, dict) and document.get("kind") == "Node":
        meta, node_spec = document.get("metadata"), document.get("spec")
        metadata: dict[str, Any] = meta if isinstance(meta, dict) else {}
        spec: dict[str, Any] = node_spec if isinstance(node_spec, dict) else {}
        found = spec.get("taints") or []
        taints = tuple(t for t in found if isinstance(t, dict)) if isinstance(found, list) \
            else ()
        document = metadata.get("labels") or {}
    if not isinstance(document, dict) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool)
            for v in document.values()):
        raise WorkloadError(f"--node-labels {source} is neither a Node nor a mapping of labels",
                            remedy="give `kubectl get node NAME -o yaml` output or a "
                                   "mapping of labels")
    labels = {str(k): str(v) for k, v in document.items()}
    return NodeView(labels, taints, driver, f"--node-labels {source}")
