"""The startup taint in the manifests: every rendered DaemonSet (each overlay, the base, the
examples) tolerates it, and the Node Readiness Controller example is a valid NodeReadinessRule
keyed on the agent's condition.

The NodeReadinessRule CRD is the project's own, stored as test data:
tests/deploy/nrc/nodereadinessrules-v0.5.0.yaml is
kubernetes-sigs/node-readiness-controller@704b65442f11cce0a4f629a48bb2305087906d44 (tag
v0.5.0), config/crd/bases/readiness.node.x-k8s.io_nodereadinessrules.yaml, unchanged. Its
openAPIV3Schema is checked with jsonschema (unknown fields refused, as `kubectl apply`'s
strict field validation does); its CEL rules (`x-kubernetes-validations`), which jsonschema
cannot run, are each restated below and every rule that applies on create must be one of
them, so a CRD update with a new rule fails here until it is restated.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from deploy.manifests import REPO, TARGETS, of_kind, pod_spec, render
from installer.agent.report import CONDITION
from installer.compat.pods.rules import tolerates
from installer.config.taint import DEFAULT_TAINT, parse

CRD = Path(__file__).parent / "nrc" / "nodereadinessrules-v0.5.0.yaml"
EXAMPLE = REPO / "daemonset" / "examples" / "node-readiness" / "nodereadinessrule.yaml"
Doc = dict[str, Any]


@pytest.mark.parametrize("target", TARGETS)
def test_every_daemonset_tolerates_the_startup_taint(target: str) -> None:
    daemonsets = of_kind(render(target), "DaemonSet")
    assert daemonsets, f"{target}: no DaemonSet rendered"
    for daemonset in daemonsets:
        tolerations = pod_spec(daemonset).get("tolerations", [])
        assert any(tolerates(t, DEFAULT_TAINT.to_api()) for t in tolerations), \
            f"{target}: {daemonset['metadata']['name']} does not tolerate {DEFAULT_TAINT}"


def test_the_toleration_check_can_fail() -> None:
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists"},
                         DEFAULT_TAINT.to_api())
    assert tolerates({"operator": "Exists"}, DEFAULT_TAINT.to_api())


# --- the Node Readiness Controller example -------------------------------------------------

def _crd_version() -> Doc:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "NodeReadinessRule"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it lists the fields."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {k: _strict(v) for k, v in schema.items()}
    if "properties" in strict and "additionalProperties" not in strict:
        strict["additionalProperties"] = False
    return strict


def _validator() -> jsonschema.Draft7Validator:
    schema = _strict(_crd_version()["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# The CRD's create-time CEL rules on spec.taint, each restated in Python (self: the taint).
TAINT_RULES: dict[str, Callable[[Doc], bool]] = {
    "self.key.startsWith('readiness.k8s.io/')": lambda t: t["key"].startswith(
        "readiness.k8s.io/"),
    "self.key.size() <= 253": lambda t: len(t["key"]) <= 253,
    "size(self.key.split('/')) == 2": lambda t: len(t["key"].split("/")) == 2,
    "size(self.key.split('/')[1]) > 0 && size(self.key.split('/')[1]) <= 63":
        lambda t: 0 < len(t["key"].split("/")[1]) <= 63,
    "self.key.split('/')[1].matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')":
        lambda t: bool(_NAME.match(t["key"].split("/")[1])),
    "!has(self.value) || self.value.size() <= 63": lambda t: len(t.get("value", "")) <= 63,
    "self.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute']":
        lambda t: t["effect"] in ("NoSchedule", "PreferNoSchedule", "NoExecute"),
}


def _cel_rules(schema: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(where, rule) for every x-kubernetes-validations rule in the schema."""
    if isinstance(schema, dict):
        for rule in schema.get("x-kubernetes-validations", []):
            yield path, " ".join(rule["rule"].split())
        for name, sub in schema.get("properties", {}).items():
            yield from _cel_rules(sub, f"{path}.{name}")
        yield from _cel_rules(schema.get("items"), f"{path}[]")


def _cel_violations(rule_doc: Doc) -> list[str]:
    """The create-time CEL rules this document breaks; AssertionError for one not restated
    (transition rules, those naming oldSelf, only apply to updates)."""
    broken = []
    for where, rule in _cel_rules(_crd_version()["schema"]["openAPIV3Schema"]):
        if "oldSelf" in rule:
            continue
        assert where == ".spec.taint" and rule in TAINT_RULES, f"unrestated rule {where}: {rule}"
        if not TAINT_RULES[rule](rule_doc["spec"]["taint"]):
            broken.append(rule)
    return broken


def example() -> Doc:
    return yaml.safe_load(EXAMPLE.read_text())


def test_the_example_is_valid_for_the_crd() -> None:
    doc = example()
    assert (doc["apiVersion"], doc["kind"]) == ("readiness.node.x-k8s.io/v1alpha1",
                                                "NodeReadinessRule")
    errors = [e.message for e in _validator().iter_errors(doc)]
    assert errors == []
    assert _cel_violations(doc) == []


def test_the_example_waits_for_the_agents_condition() -> None:
    spec = example()["spec"]
    assert spec["conditions"] == [{"type": CONDITION, "requiredStatus": "True"}]
    assert spec["taint"]["effect"] == "NoSchedule"
    own = parse(f"{spec['taint']['key']}={spec['taint']['value']}:{spec['taint']['effect']}")
    assert own is not None and own.key != DEFAULT_TAINT.key  # one owner per taint


@pytest.mark.parametrize(("change", "schema_error", "cel_error"), [
    (lambda d: d["spec"]["taint"].update(key=DEFAULT_TAINT.key), False, True),
    (lambda d: d["spec"]["taint"].update(key="readiness.k8s.io/a/b"), False, True),
    (lambda d: d["spec"]["taint"].update(effect="NoEvict"), False, True),
    (lambda d: d["spec"].pop("enforcementMode"), True, False),
    (lambda d: d["spec"].update(enforcementMode="always"), True, False),
    (lambda d: d["spec"]["conditions"][0].update(requiredStatus="true"), True, False),
    (lambda d: d["spec"].update(conditions=[]), True, False),
    (lambda d: d["spec"].update(tolerations=[]), True, False),  # an unknown field
])
def test_the_checks_catch_a_broken_rule(change: Callable[[Doc], object], schema_error: bool,
                                        cel_error: bool) -> None:
    doc = copy.deepcopy(example())
    change(doc)
    assert bool(list(_validator().iter_errors(doc))) is schema_error
    if "taint" in doc["spec"]:
        assert bool(_cel_violations(doc)) is cel_error


# --- docs/agent.md -------------------------------------------------------------------------

def _section() -> str:
    text = (REPO / "docs" / "agent.md").read_text(encoding="utf-8")
    start = text.index("## Scheduling only on ready GPU nodes: the startup taint")
    return text[start:text.index("\n## ", start + 1)]


def test_the_docs_name_the_taint_the_settings_and_each_engine_with_its_version() -> None:
    section = _section()
    version = CRD.stem.rsplit("-", 1)[1]  # the CRD validated above
    for needed in (str(DEFAULT_TAINT), "`STARTUP_TAINT`", "`STARTUP_TAINT_RESTORE=on`",
                   CONDITION, f"Node Readiness Controller]({_NRC_URL}) {version}",
                   "readiness.node.x-k8s.io/v1alpha1", str(EXAMPLE.relative_to(REPO)),
                   "`--startup-taint=gpu-node-installer/driver-not-ready` (1.29 and later",
                   "startup-taint.cluster-autoscaler.kubernetes.io/", "startupTaints",
                   "`karpenter.sh/v1`, Karpenter 1.0 and later"):
        assert needed in section, needed


def test_the_docs_list_every_reason_the_agent_gives() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "installer" / "agent").glob("*.py"))
    reasons = set(re.findall(r'Verdict\((?:True|False), "([A-Za-z]+)"', source))
    assert reasons, "no reasons found: the pattern no longer matches the agent's code"
    missing = {r for r in reasons if f"`{r}`" not in _section()}
    assert not missing, f"not documented as the condition's reasons: {missing}"


_NRC_URL = "https://github.com/kubernetes-sigs/node-readiness-controller"
