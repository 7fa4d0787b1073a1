"""JSON Schemas for the two monitoring custom resources in daemonset/examples/metrics/.

Debian ships neither the Prometheus Operator's CRDs nor Google's Managed Prometheus CRDs,
and we copy no other project's files, so these are written here, by hand, from the two
APIs' published reference docs (Prometheus Operator `monitoring.coreos.com/v1` PodMonitor;
GKE Managed Service for Prometheus `monitoring.googleapis.com/v1` PodMonitoring). They are
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
# Prometheus Operator RelabelConfig (camelCase names of Prometheus' relabel_config)
_RELABEL = _object({
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod",
                        "HashMod", "labelmap", "LabelMap", "labeldrop", "LabelDrop",
                        "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase",
                        "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
    "sourceLabels": {"type": "array", "items": {"type": "string",
                                                "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": _STRING, "targetLabel": _STRING, "regex": _STRING,
    "modulus": {"type": "integer"}, "replacement": _STRING,
})

POD_MONITOR: Schema = _object({
    "apiVersion": {"const": "monitoring.coreos.com/v1"},
    "kind": {"const": "PodMonitor"},
    "metadata": _METADATA,
    "spec": _object({
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
    }, ("selector",)),
}, ("apiVersion", "kind", "metadata", "spec"))

# GMP's relabeling is Prometheus' relabel_config in camelCase, a smaller action set.
_GMP_RELABEL = _object({
    "action": {"enum": ["replace", "lowercase", "uppercase", "keep", "drop", "keepequal",
                        "dropequal", "hashmod", "labeldrop", "labelkeep"]},
    "sourceLabels": _STRINGS, "separator": _STRING, "targetLabel": _STRING,
    "regex": _STRING, "modulus": {"type": "integer"}, "replacement": _STRING,
})

POD_MONITORING: Schema = _object({
    "apiVersion": {"const": "monitoring.googleapis.com/v1"},
    "kind": {"const": "PodMonitoring"},
    "metadata": _METADATA,
    "spec": _object({
        "selector": _LABEL_SELECTOR,
        "endpoints": {"type": "array", "minItems": 1, "items": _object({
            "port": {"anyOf": [_STRING, {"type": "integer"}]}, "path": _STRING,
            "scheme": {"enum": ["http", "https"]}, "interval": _DURATION,
            "timeout": _DURATION, "params": {"type": "object"},
            "metricRelabeling": {"type": "array", "items": _GMP_RELABEL},
            "proxyUrl": _STRING,
        }, ("port",))},
        "targetLabels": _object({
            "metadata": {"type": "array", "items": {"enum": [
                "pod", "container", "node", "top_level_controller_name",
                "top_level_controller_type"]}},
            "fromPod": {"type": "array", "items": _object({"from": _STRING, "to": _STRING},
                                                           ("from",))},
        }),
        "limits": _object({"samples": {"type": "integer"}, "labels": {"type": "integer"},
                           "labelNameLength": {"type": "integer"},
                           "labelValueLength": {"type": "integer"}}),
    }, ("selector", "endpoints")),
}, ("apiVersion", "kind", "metadata", "spec"))
