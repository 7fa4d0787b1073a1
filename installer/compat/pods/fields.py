"""The types the Kubernetes API gives the PodSpec fields `check-pod` reads.

A manifest the API server would reject for a field's type (an `image` that is a list,
tolerations that are lists, a `nodeSelector` that is a list, a number where a label value
must be a string) is not a workload that will run: the rules would judge what is left of it
and pass. So each PodSpec is first held to core/v1's types (k8s.io/api/core/v1/types.go:
PodSpec, Container, Toleration, Affinity, NodeSelectorTerm, ResourceRequirements, EnvVar,
PodResourceClaim), and the first field that breaks them names the document's problem.
Fields the rules do not read are not checked; a field set to null counts as absent, as the
API server takes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scalar:
    """A string (`kinds` "string"), an integer, a quantity (a string or a number) or a
    label value (a string, or a number written by hand); `choices`: the only values the
    API accepts (an enum)."""

    kinds: str = "string"
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class ListOf:
    item: Schema


@dataclass(frozen=True)
class MapOf:
    """A mapping of any keys to values of one schema (labels, resource lists)."""

    value: Schema


@dataclass(frozen=True)
class Fields:
    """A mapping with known fields; others are not checked."""

    fields: Mapping[str, Schema]


Schema = Scalar | ListOf | MapOf | Fields

STRING = Scalar()
QUANTITY = Scalar("quantity")
TOLERATION = Fields({  # an empty operator means Equal, an empty effect every effect
    "key": STRING, "value": STRING, "operator": Scalar(choices=("Exists", "Equal", "")),
    "effect": Scalar(choices=("NoSchedule", "PreferNoSchedule", "NoExecute", "")),
    "tolerationSeconds": Scalar("integer")})
REQUIREMENT = Fields({"key": STRING, "values": ListOf(STRING), "operator": Scalar(
    choices=("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"))})
TERM = Fields({"matchExpressions": ListOf(REQUIREMENT), "matchFields": ListOf(REQUIREMENT)})
CONTAINER = Fields({
    "name": STRING, "image": STRING,
    "env": ListOf(Fields({"name": STRING, "value": STRING})),
    "resources": Fields({"limits": MapOf(QUANTITY), "requests": MapOf(QUANTITY),
                         "claims": ListOf(Fields({"name": STRING, "request": STRING}))})})
POD_SPEC = Fields({
    "initContainers": ListOf(CONTAINER), "containers": ListOf(CONTAINER),
    "tolerations": ListOf(TOLERATION), "nodeSelector": MapOf(STRING),
    "affinity": Fields({"nodeAffinity": Fields({
        "requiredDuringSchedulingIgnoredDuringExecution": Fields({
            "nodeSelectorTerms": ListOf(TERM)}),
        "preferredDuringSchedulingIgnoredDuringExecution": ListOf(Fields({
            "weight": Scalar("integer"), "preference": TERM}))})}),
    "resourceClaims": ListOf(Fields({
        "name": STRING, "resourceClaimName": STRING, "resourceClaimTemplateName": STRING}))})

TAINT = Fields({"key": STRING, "value": STRING, "effect": Scalar(
    choices=("NoSchedule", "PreferNoSchedule", "NoExecute"))})
# A Node as `kubectl get node -o yaml` prints it: the fields `--node-labels` reads.
NODE = Fields({"metadata": Fields({"name": STRING, "labels": MapOf(Scalar("label"))}),
               "spec": Fields({"taints": ListOf(TAINT)}),
               "status": Fields({"allocatable": MapOf(QUANTITY)})})


@dataclass(frozen=True)
class FieldProblem:
    """The first field of a PodSpec whose type the API would reject, and the fix."""

    path: str
    why: str
    fix: str


def spec_problem(spec: Mapping[str, Any], base: str = "") -> FieldProblem | None:
    """The first PodSpec field that breaks core/v1's types (containers before the
    scheduling fields), or None; its path starts with `base` (a Pod's `spec`)."""
    return _check(spec, POD_SPEC, base)


def node_problem(node: Mapping[str, Any]) -> FieldProblem | None:
    """The first field of a Node document that breaks core/v1's types, or None. Label
    values may be numbers (a file written by hand); `kubectl` prints them as strings."""
    return _check(node, NODE, "")


def _check(value: Any, schema: Schema, path: str) -> FieldProblem | None:
    if value is None:
        return None
    if isinstance(schema, Scalar):
        return _scalar(value, schema, path)
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            return _wrong(value, "a list", path)
        return _first(_check(v, schema.item, f"{path}[{i}]") for i, v in enumerate(value))
    if not isinstance(value, Mapping):
        return _wrong(value, "a mapping", path)
    if isinstance(schema, MapOf):
        return _first(_check(v, schema.value, f"{path}[{k}]") for k, v in value.items())
    return _first(_check(value.get(k), s, _join(path, k)) for k, s in schema.fields.items())


def _scalar(value: Any, schema: Scalar, path: str) -> FieldProblem | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if schema.kinds == "quantity":
        ok = isinstance(value, str) or number
        return None if ok else _wrong(value, "a quantity (a string or a number)", path)
    if schema.kinds == "label":
        ok = isinstance(value, str) or number
        return None if ok else _wrong(value, "a string", path)
    if schema.kinds == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else _wrong(value, "a whole number", path)
    if number or isinstance(value, bool):
        shown = (str(value).lower() if isinstance(value, bool) else str(value))[:40]
        return FieldProblem(path, f"is {_kind(value)}, not a string",
                            f'quote the value ("{shown}"): the API takes only a string there')
    if not isinstance(value, str):
        return _wrong(value, "a string", path)
    if schema.choices and value not in schema.choices:
        return FieldProblem(path, f"is {value!r}, which the API does not accept",
                            f"use one of {', '.join(c for c in schema.choices if c)}")
    return None


def _wrong(value: Any, wanted: str, path: str) -> FieldProblem:
    return FieldProblem(path, f"is {_kind(value)}, not {wanted}",
                        f"write {path} as {wanted}, as the Kubernetes API requires (the API "
                        "server rejects this manifest)")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        shown = str(value)
        return f"the number {shown}" if len(shown) <= 40 else f"a number of {len(shown)} digits"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "a string" if isinstance(value, str) else f"a {type(value).__name__}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _first(found: Any) -> FieldProblem | None:
    return next((p for p in found if p is not None), None)
