"""`check-pod`: will this workload's PodSpec get a GPU and run on this node, rule by rule?

Reads Pods and every object holding pod templates (`workloads`), finds the GPUs each asks for
(`gpus`: every vendor's resources, MIG, DRA claims), and judges them (`rules`, `scheduling`,
`cuda`) against the platform's conventions (`platform`) or a given Node: FAIL where the pod
would get no GPU, not be scheduled there or not run there, WARN for advice. Needs no root and
no node unless the caller gives it this node's labels or driver.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from installer.compat.pods import platform as platforms
from installer.compat.pods import rules, scheduling
from installer.compat.pods.cuda import cuda_rule
from installer.compat.pods.gpus import GPU, Demand, demand
from installer.compat.pods.nodes import node_view_from_document, node_views_from_document
from installer.compat.pods.rules import FAIL, SKIP, WARN, NodeView, RuleResult
from installer.compat.pods.workloads import Documents, Workload, WorkloadError, parse
from installer.compat.toolkit import parse_cuda, parse_driver
from installer.errors import IncompatibleError

__all__ = ["Documents", "NodeView", "PodCheckFailedError", "PodReport", "Workload",
           "WorkloadError", "check", "node_view_from_document", "node_views_from_document",
           "parse"]
_VENDOR_NOTE = {"amd": "AMD", "intel": "Intel"}


class PodCheckFailedError(IncompatibleError):
    """A rule fails: the workload would not get a GPU on this node, or not run there."""


@dataclass(frozen=True)
class WorkloadReport:
    """Every rule's result for one workload (on one node, when several were given)."""

    workload: Workload
    results: tuple[RuleResult, ...]
    node: str = ""

    @property
    def passed(self) -> bool:
        return all(r.status != FAIL for r in self.results)

    def flagged(self, *, strict: bool) -> list[RuleResult]:
        """The results that make the command fail: FAIL, and WARN under --strict."""
        bad = (FAIL, WARN) if strict else (FAIL,)
        return [r for r in self.results if r.status in bad]

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        found = {"document": w.document, "kind": w.kind, "name": w.name,
                 "namespace": w.namespace, "path": w.path, "replicas": w.replicas,
                 "title": w.title, "passed": self.passed,
                 "warnings": sum(r.status == WARN for r in self.results),
                 "rules": [asdict(r) for r in self.results]}
        return {**found, "node": self.node} if self.node else found


@dataclass(frozen=True)
class PodReport:
    """The `check-pod` result for a whole input."""

    source: str
    workloads: tuple[WorkloadReport, ...]
    skipped: tuple[str, ...]
    node: NodeView
    platform: platforms.Platform
    nodes: tuple[NodeView, ...] = ()
    strict: bool = False
    problems: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.failures()

    def fits(self) -> dict[str, list[str]]:
        """Several nodes: workload title -> the nodes it fits (as a scheduler dry run)."""
        found: dict[str, list[str]] = {}
        for report in self.workloads:
            fitting = found.setdefault(report.workload.title, [])
            if not report.flagged(strict=self.strict):
                fitting.append(report.node)
        return found

    def failures(self) -> list[str]:
        if len(self.nodes) > 1:
            return [f"{title}: fits no node" for title, fit in self.fits().items() if not fit]
        return [f"{w.workload.title}: {r.rule}" for w in self.workloads
                for r in w.flagged(strict=self.strict)]

    def to_dict(self) -> dict[str, Any]:
        found = {"source": self.source, "passed": self.passed, "strict": self.strict,
                 "platform": {"name": self.platform.name, "from": self.platform.source,
                              "taint": rules.taint_text(self.platform.taint),
                              "admission_adds_tolerations": self.platform.admission,
                              "text": self.platform.describe()},
                 "node": {"labels_from": self.node.source or None, "driver": self.node.driver,
                          **({"name": self.node.name} if self.node.name else {})},
                 "workloads": [w.to_dict() for w in self.workloads],
                 "skipped": list(self.skipped), "problems": list(self.problems)}
        if len(self.nodes) > 1:
            found["nodes"] = [n.name for n in self.nodes]
            found["fits"] = self.fits()
        return found

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"platform: {self.platform.describe()}"]
        for report in self.workloads:
            on = f" on node {report.node}" if report.node else ""
            lines.append(f"{report.workload.title} (document {report.workload.document}){on}:")
            for r in report.results:
                fix = f"; fix: {r.fix}" if r.fix and r.status != "pass" else ""
                lines.append(f"  {r.status.upper():<4}  {r.rule:<13}  {r.why}{fix}")
        lines += [f"problem: {line}" for line in self.problems]
        lines += [f"skipped: {what} (no PodSpec)" for what in self.skipped]
        if len(self.nodes) > 1:
            lines += [f"fits: {title} -> {', '.join(fit) or 'no node'}"
                      for title, fit in self.fits().items()]
        return "\n".join([*lines, self._result_line()])

    def _result_line(self) -> str:
        failed = self.failures()
        warned = sum(r.status == WARN for w in self.workloads for r in w.results)
        counts = f"{sum(r.status == FAIL for w in self.workloads for r in w.results)} " \
                 f"rule(s) fail, {warned} warn" + (" (--strict: warnings fail)"
                                                    if self.strict else "")
        on = f" on {len(self.nodes)} nodes" if self.nodes else ""
        shown = f" ({', '.join(failed)})" if failed else \
            f" in {len({w.workload.title for w in self.workloads})} workload(s){on}"
        return f"result: {counts}{shown}"

    def raise_if_failed(self) -> None:
        """Exit 14 after the report is printed, so scripts can branch on it."""
        failed = self.failures()
        if failed:
            what = "workload(s) fit no node" if len(self.nodes) > 1 else \
                "rule(s) fail" + (" or warn (--strict)" if self.strict else "")
            raise PodCheckFailedError(f"{len(failed)} {what}: {', '.join(failed)}",
                                      remedy="apply each fix check-pod lists, then rerun it")


def check(documents: Documents, source: str, *, node: NodeView | Sequence[NodeView],
          cuda: str | None = None, resources: Sequence[str] = (), platform: str = "auto",
          strict: bool = False) -> PodReport:
    """Judge every workload on every node given; `resources` adds extended resources
    checked like the GPU; `platform` is a name or `auto`."""
    if cuda is not None:
        parse_cuda(cuda)
    nodes = (node,) if isinstance(node, NodeView) else tuple(node) or (NodeView(),)
    for view in nodes:
        if view.driver is not None:
            parse_driver(view.driver)
    chosen = platforms.choose(
        platform, [n.labels for n in nodes if n.labels],
        {k for w in documents.workloads for k in rules.selected_keys(w.spec)})
    kinds = {scheduling.gpu_kind(n) for n in nodes} - {""} if len(nodes) > 1 else set()
    reports = []
    for workload in documents.workloads:
        wants = demand(workload.spec, documents.others, resources)
        for view in nodes:
            results = judge(workload.spec, wants, view, chosen, cuda=cuda, kinds=kinds)
            reports.append(WorkloadReport(workload, results,
                                          view.name if len(nodes) > 1 else ""))
    return PodReport(source, tuple(reports), documents.skipped, nodes[0], chosen,
                     nodes if len(nodes) > 1 else (), strict, documents.problems)


def judge(spec: Mapping[str, Any], wants: Demand, node: NodeView,
          platform: platforms.Platform, *, cuda: str | None,
          kinds: set[str]) -> tuple[RuleResult, ...]:
    """Every rule on one PodSpec and one node; a pod that uses no GPU skips them all."""
    if not wants.uses_gpu and not wants.intent:
        return (RuleResult("gpu", SKIP, "uses no GPU: asks for no GPU resource or claim and "
                           "shows no GPU intent (NVIDIA env, CUDA image, GPU node selector)"),)
    names = wants.names or (GPU,)
    others = sorted(_VENDOR_NOTE[v] for v in wants.vendors if v in _VENDOR_NOTE)
    note = f" (an {', '.join(others)} GPU: this installer drives NVIDIA's; that GPU needs " \
           "its vendor's driver and device plugin)" if others else ""
    return (rules.limits_rule(spec, wants.names, intent=wants.intent,
                              claims=[c.describe() for c in wants.claims], note=note),
            rules.requests_rule(spec, names), rules.whole_rule(spec, names),
            scheduling.toleration_rule(spec, node, platform, wants),
            scheduling.node_selector_rule(spec, node),
            scheduling.gpu_type_rule(spec, node, wants, kinds),
            scheduling.gpu_count_rule(node, wants), scheduling.mig_rule(spec, node, wants),
            cuda_rule(spec, wants, node, cuda))
