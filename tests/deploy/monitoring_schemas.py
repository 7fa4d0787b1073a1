"""JSON Schemas for the two monitoring custom resources in daemonset/examples/metrics/.

Debian ships neither the Prometheus Operator's CRDs nor Google's Managed Prometheus CRDs,
and we copy no other project's files, so these are written here, by hand, from the two
APIs' published reference docs (Prometheus Operator `monitoring.coreos.com/v1` PodMonitor;
GKE Managed Service for Prometheus `monitoring.googleapis.com/v1` PodMonitoring and
ClusterPodMonitoring). They are
a strict SUBSET: every field our examples use, plus their documented siblings, with
`additionalProperties: false`, so a misspelt or invented field fails as the API server's
structural schema would prune or reject it. They do not prove the full CRDs accept every
value, only that each field we write exists where we write it, with the documented type.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_STRING: Schema = {"type": "string"}
_STRINGS: Schema = {"type": "array", "items": _STRING}
_DURATION: Schema = {"type": "string", "pattern": r"^(0|(([0-9]+)(ms|s|m|h|d|w|y))+)$"}


def _object(properties: Schema, required: tuple[str, ...] = ()) -> Schema:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


_LABEL_SELECTOR = _object({
    "matchLabels": {"type": "object", "additionalProperties": _STRING},
    "matchExpressions": {"type": "array", "items": _object({
        "key": _STRING, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
        "values": _STRINGS}, ("key", "operator"))},
})
_METADATA = _object({
    "name": _STRING, "namespace": _STRING,
    "labels": {"type": "object", "additionalProperties": _STRING},
    "annotations": {"type": "object", "additionalProperties": _STRING},
}, ("name",))


def _relabel(actions: list[str]) -> Schema:
    """A relabel_config in camelCase, as both APIs spell Prometheus' own."""
    return _object({
        "action": {"enum": actions}, "sourceLabels": {"type": "array", "items": {
            "type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "separator": _STRING, "targetLabel": _STRING, "regex": _STRING,
        "modulus": {"type": "integer"}, "replacement": _STRING,
    })


def _resource(api_version: str, kind: str, spec: Schema, required: tuple[str, ...]) -> Schema:
    """A namespaced custom resource: apiVersion, kind, metadata and this spec."""
    return _object({"apiVersion": {"const": api_version}, "kind": {"const": kind},
                    "metadata": _METADATA, "spec": _object(spec, required)},
                   ("apiVersion", "kind", "metadata", "spec"))


_ACTIONS = ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
            "lowercase", "uppercase", "keepequal", "dropequal"]
# The operator also takes each action capitalised; GMP has no labelmap.
_RELABEL = _relabel([*_ACTIONS, "Replace", "Keep", "Drop", "HashMod", "LabelMap", "LabelDrop",
                     "LabelKeep", "Lowercase", "Uppercase", "KeepEqual", "DropEqual"])
_GMP_RELABEL = _relabel([a for a in _ACTIONS if a != "labelmap"])

POD_MONITOR: Schema = _resource("monitoring.coreos.com/v1", "PodMonitor", {
    "selector": _LABEL_SELECTOR,
    "namespaceSelector": _object({"any": {"type": "boolean"}, "matchNames": _STRINGS}),
    "jobLabel": _STRING,
    "podTargetLabels": _STRINGS,
    "sampleLimit": {"type": "integer", "minimum": 0},
    "podMetricsEndpoints": {"type": "array", "items": _object({
        "port": _STRING, "portNumber": {"type": "integer"}, "path": _STRING,
        "scheme": {"enum": ["http", "https"]}, "interval": _DURATION,
        "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"},
        "honorTimestamps": {"type": "boolean"}, "relabelings": {"type": "array",
                                                                 "items": _RELABEL},
        "metricRelabelings": {"type": "array", "items": _RELABEL},
        "params": {"type": "object", "additionalProperties": _STRINGS},
    })},
}, ("selector",))

_POD_LABELS = ["pod", "container", "node", "top_level_controller_name",
               "top_level_controller_type"]


def _managed(kind: str, metadata: list[str]) -> Schema:
    """GMP's PodMonitoring and ClusterPodMonitoring: the same spec, except which of the
    scraped pod's labels `targetLabels.metadata` may name (the cluster-wide one may also
    leave out, or name, `namespace`)."""
    return _resource("monitoring.googleapis.com/v1", kind, {
        "selector": _LABEL_SELECTOR,
        "endpoints": {"type": "array", "minItems": 1, "items": _object({
            "port": {"anyOf": [_STRING, {"type": "integer"}]}, "path": _STRING,
            "scheme": {"enum": ["http", "https"]}, "interval": _DURATION,
            "timeout": _DURATION, "params": {"type": "object"},
            "metricRelabeling": {"type": "array", "items": _GMP_RELABEL},
            "proxyUrl": _STRING,
        }, ("port",))},
        "targetLabels": _object({
            "metadata": {"type": "array", "items": {"enum": metadata}},
            "fromPod": {"type": "array", "items": _object({"from": _STRING, "to": _STRING},
                                                           ("from",))},
        }),
        "limits": _object({"samples": {"type": "integer"}, "labels": {"type": "integer"},
                           "labelNameLength": {"type": "integer"},
                           "labelValueLength": {"type": "integer"}}),
    }, ("selector", "endpoints"))


POD_MONITORING = _managed("PodMonitoring", _POD_LABELS)
CLUSTER_POD_MONITORING = _managed("ClusterPodMonitoring", ["namespace", *_POD_LABELS])
