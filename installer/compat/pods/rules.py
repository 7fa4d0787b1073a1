"""The rules a GPU pod trips over, each judged on one PodSpec: pass, fail or skip, with why
and the fix.

GPUs go in limits (requests may be omitted or must equal limits), only whole GPUs, a
toleration for the GPU taint, a nodeSelector or node affinity naming a GPU type this node
has, and a CUDA toolkit the node's driver runs. Kubernetes' own semantics are followed for
quantities, tolerations and node selector terms.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from installer.compat import nodelabels
from installer.compat.toolkit import CudaVerdict, check_cuda, minor_compat_major
from installer.errors import ConfigError

GPU = "nvidia.com/gpu"
PASS, FAIL, SKIP = "pass", "fail", "skip"
GPU_TAINT = {"key": GPU, "effect": "NoSchedule"}  # value: `present` on GKE, any elsewhere
TOLERATION_FIX = (f"add tolerations: [{{key: {GPU}, operator: Exists, effect: NoSchedule}}] "
                  "(GKE's admission adds it for pods that request nvidia.com/gpu)")
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
           "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
           **{f"{s}i": Fraction(1024 ** (i + 1)) for i, s in enumerate("KMGTPE")}}
INF = float("inf")  # YAML's .inf and .nan are floats, and no quantity
_REQUIRE_CUDA = re.compile(r"cuda>=(\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class RuleResult:
    """One rule on one workload."""

    rule: str
    status: str
    why: str
    fix: str = ""


@dataclass(frozen=True)
class NodeView:
    """What is known of the node the pod should run on (None: not known)."""

    labels: Mapping[str, str] | None = None
    taints: tuple[Mapping[str, Any], ...] | None = None
    driver: str | None = None
    source: str = ""


def quantity(value: Any) -> Fraction | None:
    """A Kubernetes resource quantity (`1`, `500m`, `2k`, `1Gi`) as a number, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return Fraction(str(value)) if value == value and abs(value) != INF else None
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return None
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E") and suffix[1:].lstrip("+-").isdigit():
        exponent = int(suffix[1:])  # `1e999999999` would take hours: no real quantity's
        return number * Fraction(10) ** exponent if abs(exponent) <= 30 else None
    return number * _SUFFIX.get(suffix, Fraction(1))


def containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for field in ("initContainers", "containers"):
        found = spec.get(field)
        for container in found if isinstance(found, list) else ():
            if isinstance(container, dict):
                yield container


def _resources(container: Mapping[str, Any], which: str) -> Mapping[str, Any]:
    resources = container.get("resources")
    found = resources.get(which) if isinstance(resources, dict) else None
    return found if isinstance(found, dict) else {}


def gpu_containers(spec: Mapping[str, Any], names: Sequence[str]) -> list[Mapping[str, Any]]:
    """Containers that get a GPU: a checked resource in their limits."""
    return [c for c in containers(spec) if any(n in _resources(c, "limits") for n in names)]


# ---- resources ---------------------------------------------------------------------------

def limits_rule(spec: Mapping[str, Any], names: Sequence[str]) -> RuleResult:
    """Some container has the GPU in `limits`: that is what the scheduler counts."""
    found = [f"container {c['name']}: {n}={_resources(c, 'limits')[n]}"
             for c in containers(spec) for n in names if n in _resources(c, "limits")]
    if found:
        return RuleResult("limits", PASS, "; ".join(found) + " in limits")
    return RuleResult("limits", FAIL, f"no container has {' or '.join(names)} in "
                      "resources.limits, so the pod gets no GPU",
                      f"set resources.limits: {{{names[0]}: 1}} on the container that "
                      "uses the GPU")


def requests_rule(spec: Mapping[str, Any], names: Sequence[str]) -> RuleResult:
    """Requests may be omitted; when given they equal limits; never requests alone."""
    problems = []
    for container in containers(spec):
        limits, requests = _resources(container, "limits"), _resources(container, "requests")
        for name in (n for n in names if n in requests):
            if name not in limits:
                problems.append(f"container {container['name']}: {name} in requests "
                                f"({requests[name]}) without limits (the API server rejects "
                                "this)")
            elif quantity(requests[name]) != quantity(limits[name]):
                problems.append(f"container {container['name']}: {name} requests "
                                f"{requests[name]} differ from limits {limits[name]}")
    if problems:
        return RuleResult("requests", FAIL, "; ".join(problems),
                          "put GPUs in limits; leave requests out or make them equal")
    return RuleResult("requests", PASS, "no GPU requests without limits; requests given "
                      "equal limits")


def whole_rule(spec: Mapping[str, Any], names: Sequence[str]) -> RuleResult:
    """Extended resources are counted in whole units: no 0.5 GPU."""
    problems = []
    for container in containers(spec):
        for which in ("limits", "requests"):
            for name in (n for n in names if n in _resources(container, which)):
                raw = _resources(container, which)[name]
                number = quantity(raw)
                if number is None or number < 0 or number.denominator != 1:
                    problems.append(f"container {container['name']}: {name} {which[:-1]} "
                                    f"{raw!r} is not a whole number")
    if problems:
        return RuleResult("whole", FAIL, "; ".join(problems),
                          "ask for whole GPUs (1, 2, ...); share a GPU through MIG or "
                          "time-slicing resources instead")
    return RuleResult("whole", PASS, "every GPU quantity is a whole number")


# ---- scheduling ----------------------------------------------------------------------------

def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule; a taint without a value (unknown) matches any Equal value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return "value" not in taint or (toleration.get("value") or "") == taint.get("value")


def _on_gke(spec: Mapping[str, Any], node: NodeView) -> bool:
    labels = node.labels or {}
    return (nodelabels.GKE_ACCELERATOR in labels or "cloud.google.com/gke-nodepool" in labels
            or nodelabels.GKE_ACCELERATOR in selected_keys(spec))


def toleration_rule(spec: Mapping[str, Any], node: NodeView, wants_gpu: bool) -> RuleResult:
    """The pod tolerates the GPU node's taints (the node's own, when a Node was given)."""
    found = spec.get("tolerations")
    tolerations = [t for t in found if isinstance(t, dict)] if isinstance(found, list) else []
    taints = [t for t in node.taints if t.get("effect") in ("NoSchedule", "NoExecute")] \
        if node.taints is not None else [GPU_TAINT]
    missing = [t for t in taints if not any(tolerates(tol, t) for tol in tolerations)]
    if not missing:
        return RuleResult("toleration", PASS, "tolerates " + (", ".join(
            _taint(t) for t in taints) or "every taint (the node has none)"))
    gpu_only = all(t.get("key") == GPU for t in missing)
    if gpu_only and wants_gpu and _on_gke(spec, node):
        return RuleResult("toleration", PASS, f"no toleration for {GPU}, but GKE's admission "
                          "adds it to pods that request nvidia.com/gpu")
    fix = TOLERATION_FIX if gpu_only else "add tolerations for " + ", ".join(map(_taint, missing))
    return RuleResult("toleration", FAIL, "does not tolerate the GPU node's taint "
                      + ", ".join(map(_taint, missing)) + ", so it cannot land there", fix)


def _taint(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node_affinity, dict) else None
    if not isinstance(required, dict):
        return None
    terms = required.get("nodeSelectorTerms")
    return [t for t in terms if isinstance(t, dict)] if isinstance(terms, list) else []


def _expressions(term: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = term.get("matchExpressions")
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def _selector(spec: Mapping[str, Any]) -> dict[str, str]:
    found = spec.get("nodeSelector")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def selected_keys(spec: Mapping[str, Any]) -> set[str]:
    """Label keys the pod's nodeSelector and required node affinity name."""
    keys = set(_selector(spec))
    for term in _terms(spec) or ():
        keys |= {str(e.get("key")) for e in _expressions(term)}
    return keys


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = str(expression.get("key")), expression.get("operator")
    raw = expression.get("values")
    values = [str(v) for v in raw] if isinstance(raw, list) else []
    value = labels.get(key)
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def mismatch(spec: Mapping[str, Any], labels: Mapping[str, str]) -> str | None:
    """Why this node's labels do not satisfy the pod's nodeSelector and required affinity
    (terms are ORed, expressions ANDed, as the scheduler does), or None when they do."""
    for key, want in _selector(spec).items():
        if labels.get(key) != want:
            have = labels.get(key)
            return f"nodeSelector {key}={want}, but this node has " + (
                f"{key}={have}" if have is not None else f"no {key} label")
    terms = _terms(spec)
    if terms is None:
        return None
    for term in terms:
        if all(_expression_matches(e, labels) for e in _expressions(term)) \
                and not term.get("matchFields"):
            return None
    if not terms:
        return "required node affinity has no nodeSelectorTerms (matches no node)"
    failing = [e for e in _expressions(terms[0]) if not _expression_matches(e, labels)]
    shown = failing[0] if failing else {}
    key = str(shown.get("key", "matchFields"))
    return (f"required node affinity {key} {shown.get('operator', '')} "
            f"{shown.get('values', '')}".rstrip() + f", but this node has {key}="
            f"{labels.get(key, '(none)')}")


def gpu_type_rule(spec: Mapping[str, Any], node: NodeView) -> RuleResult:
    """The pod picks a GPU type (Kubernetes cannot tell GPU types apart), one this node has."""
    labels = node.labels
    product = (labels or {}).get(f"{nodelabels.OWN_PREFIX}/gpu.product") or (
        labels or {}).get(f"{nodelabels.NVIDIA_PREFIX}/gpu.product")
    example = product or "<product>"
    fix = (f"add nodeSelector: {{{nodelabels.OWN_PREFIX}/gpu.product: {example}}} "
           f"(or nvidia.com/gpu.product, {nodelabels.GKE_ACCELERATOR})")
    if labels is not None:
        why = mismatch(spec, labels)
        if why is not None:
            return RuleResult("gpu-type", FAIL, why + f" (labels from {node.source})",
                              fix.replace("add", "select what this node has:", 1))
    named = sorted(k for k in selected_keys(spec) if nodelabels.names_gpu_type(k))
    if not named:
        return RuleResult("gpu-type", FAIL, "neither nodeSelector nor required node affinity "
                          "names a GPU type, and Kubernetes does not tell GPU types apart", fix)
    where = f"; this node ({node.source}) matches" if labels is not None else \
        " (no node labels given: --node-labels FILE or --here to check this node)"
    return RuleResult("gpu-type", PASS, f"selects the GPU type by {', '.join(named)}{where}")


# ---- CUDA ----------------------------------------------------------------------------------

def container_cuda(container: Mapping[str, Any]) -> str | None:
    """The CUDA toolkit a container declares: NVIDIA_REQUIRE_CUDA's `cuda>=X.Y`, else
    CUDA_VERSION (what NVIDIA's CUDA images set)."""
    found = container.get("env")
    env = {str(e.get("name")): e.get("value") for e in found if isinstance(e, dict)} \
        if isinstance(found, list) else {}
    required = env.get("NVIDIA_REQUIRE_CUDA")
    match = _REQUIRE_CUDA.search(required) if isinstance(required, str) else None
    if match:
        return match.group(1)
    version = env.get("CUDA_VERSION")
    return version.strip() if isinstance(version, str) and version.strip() else None


def cuda_rule(spec: Mapping[str, Any], names: Sequence[str], node: NodeView,
              cuda: str | None) -> RuleResult:
    """Each GPU container's CUDA toolkit runs on the node's driver (the `compat` rules)."""
    gpu = gpu_containers(spec, names)
    if not gpu:
        return RuleResult("cuda", SKIP, "no container gets a GPU")
    if node.driver is None:
        return RuleResult("cuda", SKIP, "no driver to check the CUDA toolkit against",
                          "give --driver VERSION, or --here on the node")
    passed: list[tuple[str, CudaVerdict]] = []
    failed: list[tuple[str, CudaVerdict]] = []
    unknown: list[str] = []
    for container in gpu:
        version = cuda or container_cuda(container)
        if version is None:
            unknown.append(f"container {container['name']}: no CUDA version known")
            continue
        try:
            verdict = check_cuda(version, node.driver)
        except ConfigError as exc:
            unknown.append(f"container {container['name']}: {exc.message}")
            continue
        line = f"container {container['name']}: {verdict.reason}"
        (passed if verdict.compatible else failed).append((line, verdict))
    if failed:
        newest = failed[0][1].max_cuda or "an older toolkit"
        need = failed[0][1].minimum_driver or failed[0][1].minor_version_floor or "newer"
        major = minor_compat_major(node.driver)
        also = f" (or any {major}.x, through minor version compatibility)" if major else ""
        return RuleResult("cuda", FAIL, "; ".join(line for line, _ in failed),
                          f"run it on nodes with driver >= {need}, or build the image with "
                          f"CUDA {newest} or older{also}")
    if not passed:
        return RuleResult("cuda", SKIP, "; ".join(unknown),
                          "give --cuda X.Y, or set NVIDIA_REQUIRE_CUDA/CUDA_VERSION in the "
                          "container's env")
    return RuleResult("cuda", PASS, "; ".join([line for line, _ in passed] + unknown)
                      + f" (driver {node.driver})")
