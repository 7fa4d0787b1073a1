"""Strict JSON schemas for the two alert-rule objects under daemonset/examples/metrics/, written
from their CRDs (neither ships with Debian): every field the CRD declares, nothing else
(unknown fields fail, as `kubectl apply --validate=strict` refuses them), the required ones.

- PrometheusRule, monitoring.coreos.com/v1: prometheus-operator
  `example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml` at
  6adcebc5076c34f4f55f8f5f7b1e528929373ac7 (groups: name required; rules: expr required,
  an integer or a string; durations as its pattern).
- Rules, monitoring.googleapis.com/v1 (GKE Managed Service for Prometheus):
  GoogleCloudPlatform/prometheus-engine `charts/operator/crds/monitoring.googleapis.com_rules.yaml`
  at 2ffde4ec7b7e4ca1da4e32f36b692945b78a60e4 (groups: name and at least one rule required;
  a rule: expr required, exactly one of record and alert, annotations only on alerts).

What they do not prove: that an operator loads the rules (the tests run them through
`promtool test rules` instead).
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]
DURATION = (r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
            r"(([0-9]+)ms)?)$")
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STRINGS,
    "annotations": _STRINGS}, "required": ["name"], "additionalProperties": False}


def _object(properties: Schema, required: list[str]) -> Schema:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def _resource(api_version: str, kind: str, group: Schema) -> Schema:
    spec = _object({"groups": {"type": "array", "items": group}}, ["groups"])
    return _object({"apiVersion": {"const": api_version}, "kind": {"const": kind},
                    "metadata": _METADATA, "spec": spec},
                   ["apiVersion", "kind", "metadata", "spec"])


_DURATION = {"type": "string", "pattern": DURATION}
_OPERATOR_RULE = _object({
    "alert": {"type": "string"}, "annotations": _STRINGS,
    "expr": {"type": ["integer", "string"]}, "for": _DURATION,
    "keep_firing_for": {**_DURATION, "minLength": 1}, "labels": _STRINGS,
    "record": {"type": "string"}}, ["expr"])
PROMETHEUS_RULE = _resource("monitoring.coreos.com/v1", "PrometheusRule", _object({
    "interval": _DURATION, "labels": _STRINGS, "limit": {"type": "integer"},
    "name": {"type": "string", "minLength": 1},
    # the CRD's ^(?i)(abort|warn)?$, with the flag first as Python's re requires
    "partial_response_strategy": {"type": "string", "pattern": "(?i)^(abort|warn)?$"},
    "query_offset": _DURATION, "rules": {"type": "array", "items": _OPERATOR_RULE}},
    ["name"]))

_GMP_RULE = {**_object({
    "alert": {"type": "string"}, "annotations": _STRINGS, "expr": {"type": "string"},
    "for": {"type": "string"}, "labels": _STRINGS,
    "record": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"}}, ["expr"]),
    # x-kubernetes-validations: exactly one of record and alert; annotations only on alerts
    "oneOf": [{"required": ["alert"], "not": {"required": ["record"]}},
              {"required": ["record"], "not": {"anyOf": [{"required": ["alert"]},
                                                         {"required": ["annotations"]}]}}]}
RULES = _resource("monitoring.googleapis.com/v1", "Rules", _object({
    "interval": {"type": "string"}, "name": {"type": "string"},
    "rules": {"type": "array", "items": _GMP_RULE, "minItems": 1}}, ["name", "rules"]))
