"""Will the scheduler put this pod on this node: taints against tolerations (with what the
platform's admission adds), every nodeSelector entry and required affinity term, the GPU
type, the GPU count against the node's allocatable, and the MIG slice the node offers.

Without a node the rules judge against the platform's conventions and can only warn; with a
Node document they judge exactly what kube-scheduler's filters would.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from installer.compat import nodelabels
from installer.compat.pods.gpus import (
    GPU,
    PARTITION,
    TYPE_KEYS,
    Demand,
    is_gpu_resource,
    is_gpu_type_key,
)
from installer.compat.pods.platform import Platform
from installer.compat.pods.rules import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    NodeView,
    RuleResult,
    expression_matches,
    expressions,
    quantity,
    selected_keys,
    selector,
    taint_text,
    terms,
    tolerates,
)
from installer.config.taint import DEFAULT_TAINT

# where a node says how many NVIDIA GPUs it has, when no allocatable is given
COUNT_KEYS = (f"{nodelabels.OWN_PREFIX}/gpu.count", f"{nodelabels.NVIDIA_PREFIX}/gpu.count",
              "cloud.google.com/gke-accelerator-count", "karpenter.k8s.aws/instance-gpu-count",
              "eks.amazonaws.com/instance-gpu-count")
# the GPU-type labels a fix names, in order of preference
FIX_KEYS = (nodelabels.GKE_ACCELERATOR, "karpenter.k8s.aws/instance-gpu-name",
            "eks.amazonaws.com/instance-gpu-name",
            *(f"{p}/gpu.product" for p in nodelabels.PREFIXES), *TYPE_KEYS)


def _tolerations(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = spec.get("tolerations")
    return [t for t in found if isinstance(t, dict)] if isinstance(found, list) else []


def _toleration_fix(taints: list[Mapping[str, Any]]) -> str:
    items = ", ".join(f"{{key: {t.get('key')}, operator: Exists, effect: {t.get('effect')}}}"
                      for t in taints)
    return f"add tolerations: [{items}]"


def toleration_rule(spec: Mapping[str, Any], node: NodeView, platform: Platform,
                    demand: Demand) -> RuleResult:
    """The node's NoSchedule/NoExecute taints (or the platform's usual GPU taint) are
    tolerated by the pod or by what admission adds."""
    known = node.taints is not None
    if node.taints is not None:
        taints = [t for t in node.taints if t.get("effect") in ("NoSchedule", "NoExecute")]
    else:
        wanted = demand.names or ("",)
        taints = list({taint_text(t): t for t in map(platform.expected_taint, wanted)}.values())
    tolerations = _tolerations(spec)
    starting = [t for t in taints if t.get("key") == DEFAULT_TAINT.key]
    taints = [t for t in taints if t not in starting]  # not the pod's to tolerate
    missing = [t for t in taints if not any(tolerates(tol, t) for tol in tolerations)]
    added = [t for t in missing if platform.adds_toleration(t, demand.names)]
    missing = [t for t in missing if t not in added]
    where = f"node {node.name or node.source}" if known else \
        f"GPU nodes ({platform.name}: the usual taint; no Node given)"
    note = f"; {platform.name}'s admission adds the toleration for " + ", ".join(
        map(taint_text, added)) if added else ""
    if not missing:
        shown = ", ".join(map(taint_text, taints)) or "no taints"
        return _startup_taint(tolerations, starting, RuleResult(
            "toleration", PASS, f"tolerates {where}: {shown}{note}"))
    status = FAIL if known else WARN
    consequence = "so it cannot land there" if known else \
        "so it cannot land on a GPU node that carries it"
    return _startup_taint(tolerations, starting, RuleResult(
        "toleration", status, f"does not tolerate the taint "
        f"{', '.join(map(taint_text, missing))} of {where}, {consequence}{note}",
        _toleration_fix(missing)))


def _startup_taint(tolerations: list[Mapping[str, Any]], on_node: list[Mapping[str, Any]],
                   result: RuleResult) -> RuleResult:
    """The installer's startup taint (STARTUP_TAINT's default): the agent removes it once
    the driver is ready, so a GPU pod should wait for that, not tolerate it."""
    if any(tolerates(tol, DEFAULT_TAINT.to_api()) for tol in tolerations):
        return RuleResult(result.rule, WARN if result.status == PASS else result.status,
                          f"{result.why}; it tolerates the startup taint {DEFAULT_TAINT}: "
                          "tolerating the startup taint lets the pod land before the driver "
                          "is ready", result.fix or f"drop the toleration that matches "
                          f"{DEFAULT_TAINT.key} (a catch-all `operator: Exists` one too): "
                          "the node agent removes that taint once the driver is ready")
    if on_node:
        return RuleResult(result.rule, WARN if result.status == PASS else result.status,
                          f"{result.why}; the node carries the startup taint "
                          f"{taint_text(on_node[0])}: its driver is not ready yet, and the "
                          "node agent removes the taint when it is (the pod lands then; "
                          "it need not tolerate it)", result.fix or "wait for the node's "
                          "driver (condition gpu-node-installer/DriverReady); do not tolerate "
                          "the startup taint")
    return result


def _matches_fields(term: Mapping[str, Any], node: NodeView) -> bool:
    found = term.get("matchFields")
    fields = [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []
    return all(f.get("key") == "metadata.name"
               and expression_matches({**f, "key": "name"}, {"name": node.name})
               for f in fields)


def _shown(labels: Mapping[str, str], key: str) -> str:
    return f"{key}={labels[key]}" if key in labels else f"no {key} label"


def selector_problems(spec: Mapping[str, Any], node: NodeView) -> list[tuple[str, str]]:
    """(why, fix) for each nodeSelector entry and the required affinity terms this node's
    labels fail (terms are ORed, expressions ANDed, as the scheduler does)."""
    labels = node.labels or {}
    problems = []
    for key, want in selector(spec).items():
        if labels.get(key) != want:
            fix = f"select {key}: {labels[key]} (this node's)" if key in labels else \
                f"drop nodeSelector {key}, or pick a node labelled {key}={want}"
            problems.append((f"nodeSelector {key}={want}, but this node has "
                             f"{_shown(labels, key)}", fix))
    found = terms(spec)
    if found is None or any(_matches_fields(t, node) and all(
            expression_matches(e, labels) for e in expressions(t)) for t in found):
        return problems
    if not found:
        return [*problems, ("required node affinity has no nodeSelectorTerms (matches no "
                            "node)", "give at least one term, or drop the required affinity")]
    for term in found:
        failing = [e for e in expressions(term) if not expression_matches(e, labels)]
        for e in failing:
            key = str(e.get("key"))
            problems.append((f"required node affinity {key} {e.get('operator')} "
                             f"{e.get('values', '')}".rstrip() + f", but this node has "
                             f"{_shown(labels, key)}",
                             f"make one nodeSelectorTerm match {_shown(labels, key)}"))
        if not failing:
            problems.append(("required node affinity matchFields do not name this node",
                             f"name metadata.name {node.name} or drop matchFields"))
    return problems


def node_selector_rule(spec: Mapping[str, Any], node: NodeView) -> RuleResult:
    """Every nodeSelector entry and required affinity term, judged on the node's labels."""
    if node.labels is None:
        return RuleResult("node-selector", SKIP, "no node labels given (--node-labels FILE "
                          "or --here)")
    problems = selector_problems(spec, node)
    if problems:
        return RuleResult("node-selector", FAIL, "; ".join(w for w, _ in problems)
                          + f" (labels from {node.source})", "; ".join(f for _, f in problems))
    count = len(selected_keys(spec))
    return RuleResult("node-selector", PASS, f"this node ({node.source}) matches all {count} "
                      "label(s) the pod selects" if count else
                      "no nodeSelector or required node affinity: any node's labels match")


def gpu_label(labels: Mapping[str, str]) -> str | None:
    """`key: value` of the GPU-type label this node actually carries, preferred first."""
    for key in FIX_KEYS:
        if key in labels:
            return f"{key}: {labels[key]}"
    return None


def gpu_type_rule(spec: Mapping[str, Any], node: NodeView, demand: Demand,
                  kinds: set[str]) -> RuleResult:
    """The pod picks its GPU type where that matters: Kubernetes cannot tell GPU types apart.
    `kinds`: the GPU types of the nodes given (more than one: the choice matters)."""
    if not demand.uses_gpu:
        return RuleResult("gpu-type", SKIP, "asks for no GPU")
    named = sorted(k for k in selected_keys(spec) if is_gpu_type_key(k))
    if named:
        return RuleResult("gpu-type", PASS, f"selects the GPU type by {', '.join(named)}")
    shown = gpu_label(node.labels or {})
    fix = f"add nodeSelector: {{{shown or 'gpu-node-installer/gpu.product: <product>'}}}"
    if len(kinds) > 1 and gpu_kind(node) in kinds:
        return RuleResult("gpu-type", WARN, "selects no GPU type, and the nodes' GPUs differ "
                          f"({', '.join(sorted(kinds))}): it may land on any of them", fix)
    if node.labels is not None:
        return RuleResult("gpu-type", PASS, "selects no GPU type; on this node it gets "
                          + (shown or "whatever GPU the node has"))
    return RuleResult("gpu-type", PASS, "selects no GPU type: any GPU node will do (give "
                      "the cluster's Nodes to --node-labels to see whether their GPUs differ)")


def gpu_kind(node: NodeView) -> str:
    """The GPU type a node's labels name ("" when none, or when it offers no GPU)."""
    if node.allocatable is not None and not any(
            is_gpu_resource(k) and quantity(v) for k, v in node.allocatable.items()):
        return ""
    shown = gpu_label(node.labels or {})
    return shown.split(": ", 1)[1] if shown else ""


def _node_has(node: NodeView, resource: str) -> tuple[Fraction | None, str]:
    """How many of `resource` the node offers, and where that number comes from."""
    if node.allocatable is not None:
        return quantity(node.allocatable.get(resource, 0)), "allocatable"
    labels = node.labels or {}
    for key in COUNT_KEYS if resource == GPU else ():
        if key in labels:
            return quantity(labels[key]), f"label {key}"
    return None, ""


def _number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def gpu_count_rule(node: NodeView, demand: Demand) -> RuleResult:
    """The pod's GPUs (the sum over containers, as the scheduler counts) fit the node's
    allocatable (all of it: GPUs other pods hold are not counted off)."""
    if not demand.resources:
        why = "no GPU quantity to count (see `whole`)" if demand.names else \
            "DRA claims: the scheduler allocates devices from the driver's ResourceSlices" \
            if demand.claims else "asks for no GPU"
        return RuleResult("gpu-count", SKIP, why)
    asked = ", ".join(f"{n}={_number(v)}" for n, v in demand.resources.items())
    short, known = [], []
    for name, want in demand.resources.items():
        have, where = _node_has(node, name)
        if have is None:
            continue
        known.append(f"{name}: {where} {_number(have)}")
        if want > have:
            short.append(f"asks for {_number(want)} {name}, but this node's {where} is "
                         f"{_number(have)}")
    if short:
        return RuleResult("gpu-count", FAIL, "; ".join(short) + ", so it is never scheduled "
                          "there", "ask for at most what one node has (spread the work over "
                          "more pods), or pick a node with more GPUs")
    if not known:
        return RuleResult("gpu-count", SKIP, f"asks for {asked} per pod; no node "
                          "allocatable to compare (give the Node: kubectl get node NAME -o "
                          "yaml)")
    return RuleResult("gpu-count", PASS, f"asks for {asked} per pod; node {'; '.join(known)}")


def partition(spec: Mapping[str, Any]) -> str | None:
    """The GKE MIG partition size the pod selects."""
    if PARTITION in selector(spec):
        return selector(spec)[PARTITION]
    for term in terms(spec) or ():
        for e in expressions(term):
            values = e.get("values")
            if e.get("key") == PARTITION and e.get("operator") == "In" \
                    and isinstance(values, list) and values:
                return str(values[0])
    return None


def offered_slices(node: NodeView) -> dict[str, str]:
    """MIG profile -> where this node says it offers it (GKE's partition-size label,
    gpu-feature-discovery's labels, the device plugin's allocatable)."""
    labels, found = node.labels or {}, {}
    if PARTITION in labels:
        found[labels[PARTITION]] = f"label {PARTITION}"
    config = labels.get("nvidia.com/mig.config", "")
    if config.startswith("all-") and config[4:] not in ("disabled", "balanced"):
        found[config[4:]] = "label nvidia.com/mig.config"
    for key, value in labels.items():
        if key.startswith("nvidia.com/mig-") and key.endswith(".count") and value != "0":
            found[key[len("nvidia.com/mig-"):-len(".count")]] = f"label {key}"
    for key, value in (node.allocatable or {}).items():
        if key.startswith("nvidia.com/mig-") and quantity(value):
            found[key[len("nvidia.com/mig-"):]] = f"allocatable {key}"
    return found


def mig_rule(spec: Mapping[str, Any], node: NodeView, demand: Demand) -> RuleResult:
    """A MIG slice the pod asks for (a `nvidia.com/mig-*` resource, or GKE's partition-size
    selector) is one this node is partitioned into."""
    wanted = demand.mig_profiles()
    size = partition(spec)
    via = [f"nvidia.com/mig-{p}" for p in wanted] + ([f"{PARTITION}={size}"] if size else [])
    if size:
        wanted.append(size)
    if not wanted:
        return RuleResult("mig", SKIP, "asks for no MIG slice")
    if node.labels is None and node.allocatable is None:
        return RuleResult("mig", SKIP, f"asks for MIG {', '.join(sorted(set(wanted)))} "
                          f"({', '.join(via)}); no node to check it offers that slice")
    offers = offered_slices(node)
    lacking = sorted(set(wanted) - set(offers))
    if lacking:
        have = ", ".join(f"{p} ({w})" for p, w in sorted(offers.items())) or \
            "no MIG slices (no partition-size, mig.config or mig-*.count labels, no " \
            "nvidia.com/mig-* allocatable)"
        return RuleResult("mig", FAIL, f"asks for MIG {', '.join(lacking)}, but this node "
                          f"offers {have}",
                          f"pick a node partitioned into {lacking[0]} (GKE: a node pool with "
                          f"gpu-partition-size={lacking[0]}; elsewhere nvidia.com/mig.config="
                          f"all-{lacking[0]})")
    return RuleResult("mig", PASS, "this node offers MIG " + ", ".join(
        f"{p} ({offers[p]})" for p in sorted(set(wanted))))
