"""The rules a GPU pod trips over, each judged on one PodSpec (pass, warn, fail or skip,
with why and the fix), and the Kubernetes semantics they share.

Here: GPUs go in limits (requests may be omitted or must equal limits), only whole GPUs.
`scheduling` judges taints, node selectors, GPU type, count and MIG slices against a node;
`cuda` the toolkit against the driver. Kubernetes' own semantics are followed for
quantities, tolerations and node selector terms.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from installer.node.documents import quote

GPU = "nvidia.com/gpu"
PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
           "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
           **{f"{s}i": Fraction(1024 ** (i + 1)) for i, s in enumerate("KMGTPE")}}
INF = float("inf")  # YAML's .inf and .nan are floats, and no quantity


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
    name: str = ""                                  # metadata.name of a Node document
    allocatable: Mapping[str, str] | None = None    # a Node document's status.allocatable


def quantity(value: Any) -> Fraction | None:
    """A Kubernetes resource quantity (`1`, `500m`, `2k`, `1Gi`) as a number, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):  # huge ints: no real quantity, and str() refuses them
        return Fraction(value) if abs(value) <= 10**30 else None
    if isinstance(value, float):
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


def resources(container: Mapping[str, Any], which: str) -> Mapping[str, Any]:
    resources = container.get("resources")
    found = resources.get(which) if isinstance(resources, dict) else None
    return found if isinstance(found, dict) else {}


def gpu_containers(spec: Mapping[str, Any], names: Sequence[str]) -> list[Mapping[str, Any]]:
    """Containers that get a GPU: a checked resource in their limits."""
    return [c for c in containers(spec) if any(n in resources(c, "limits") for n in names)]


# ---- resources ---------------------------------------------------------------------------

def limits_rule(spec: Mapping[str, Any], names: Sequence[str], *,
                intent: Sequence[str] = (), claims: Sequence[str] = (),
                note: str = "") -> RuleResult:
    """Some container has the GPU in `limits` (what the scheduler counts) or a GPU claim."""
    found = [f"container {c['name']}: {n}={resources(c, 'limits')[n]}"
             for c in containers(spec) for n in names if n in resources(c, "limits")]
    if found or claims:
        shown = "; ".join(found) + (" in limits" if found else "")
        return RuleResult("limits", PASS, "; ".join(filter(None, (shown, *claims))) + note)
    wanted = names or (GPU,)
    why = f", although it shows GPU intent ({'; '.join(intent)})" if intent else ""
    return RuleResult("limits", FAIL, f"no container has {' or '.join(wanted)} in "
                      f"resources.limits{why}, so the pod gets no GPU",
                      f"set resources.limits: {{{wanted[0]}: 1}} on the container that "
                      "uses the GPU")


def requests_rule(spec: Mapping[str, Any], names: Sequence[str]) -> RuleResult:
    """Requests may be omitted; when given they equal limits; never requests alone."""
    problems = []
    for container in containers(spec):
        limits, requests = resources(container, "limits"), resources(container, "requests")
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
            for name in (n for n in names if n in resources(container, which)):
                raw = resources(container, which)[name]
                number = quantity(raw)
                if number is None or number < 0 or number.denominator != 1:
                    problems.append(f"container {container['name']}: {name} {which[:-1]} "
                                    f"{quote(raw)} is not a whole number")
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


def taint_text(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node_affinity, dict) else None
    if not isinstance(required, dict):
        return None
    found = required.get("nodeSelectorTerms")
    return [t for t in found if isinstance(t, dict)] if isinstance(found, list) else []


def expressions(term: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = term.get("matchExpressions")
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def selector(spec: Mapping[str, Any]) -> dict[str, str]:
    found = spec.get("nodeSelector")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def selected_keys(spec: Mapping[str, Any]) -> set[str]:
    """Label keys the pod's nodeSelector and required node affinity name."""
    keys = set(selector(spec))
    for term in terms(spec) or ():
        keys |= {str(e.get("key")) for e in expressions(term)}
    return keys


def expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
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
