"""The alerts of daemonset/examples/metrics/ (prometheusrule.yaml for the Prometheus Operator,
rules.yaml for GKE's Managed Service for Prometheus): strictly valid for their CRDs
(tests/deploy/alert_schemas.py), the same rules in both, only metrics the agent serves, and
every alert run by `promtool test rules` over the series the agent served on the sample node
(tests/deploy/alerts/agent-sample-node.prom; tests/host/test_metrics_alert_series.py keeps it
true), as the PodMonitor's scrape labels them: unchanged, no alert fires; with the one
change each alert is about, it fires, with its labels and annotations, and not before its
`for` has passed."""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from metricexamples import EXAMPLES
from prometheus import binary
from prometheus_client.parser import text_string_to_metric_families

from deploy.alert_schemas import PROMETHEUS_RULE, RULES
from deploy.test_metrics_examples import METRICS, PROMQL_WORDS

RECORDED = Path(__file__).resolve().parent / "alerts" / "agent-sample-node.prom"
# What the PodMonitor's scrape adds (honorLabels: a series' own namespace/pod/container win)
TARGET = {"job": "gpu-node-installer", "instance": "10.8.0.12:9420", "node": "gpu-node-1",
          "namespace": "gpu-node-installer", "pod": "gpu-node-installer-x7k2p",
          "container": "agent"}
MINUTES = 60  # each series holds a sample a minute for an hour
Key = tuple[str, frozenset[tuple[str, str]]]
ALERTS = ["GpuNodeNotReady", "GpuCriticalXid", "GpuDriverInstallFailed", "GpuFabricIncomplete",
          "GpuRowRemapFailure", "GpuMetricsCollectionFailing", "GpuNodeNextKernelWithoutDriver"]
NEXT_KERNEL = "gpu_node_installer_next_kernel_ready"


def next_kernel(state: str, kernel: str = "6.1.0-58-amd64") -> Key:
    """A next kernel's series, as the agent serves it with one (the sample node has none)."""
    return NEXT_KERNEL, frozenset({**TARGET, "kernel": kernel, "state": state}.items())


def _docs(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def groups() -> list[dict[str, Any]]:
    (rule,) = _docs("prometheusrule.yaml")
    return list(rule["spec"]["groups"])


def rules() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups() for rule in group["rules"]}


def recorded() -> dict[Key, float]:
    """The recorded series with the scrape's target labels, as Prometheus stores them."""
    found = {}
    for family in text_string_to_metric_families(RECORDED.read_text()):
        for sample in family.samples:
            found[(sample.name, frozenset({**TARGET, **sample.labels}.items()))] = sample.value
    return found


def one(series: dict[Key, float], name: str, **labels: str) -> Key:
    (key,) = [k for k in series if k[0] == name and set(labels.items()) <= k[1]]
    return key


def with_labels(key: Key, **labels: str) -> Key:
    return key[0], frozenset({**dict(key[1]), **labels}.items())


@dataclass
class Case:
    """One alert's trigger: series whose values change ("0x60", "0+12x60"), series gone."""

    alert: str
    fires_at: str  # eval time when it must fire (and not before `for`)
    pending_at: str | None  # an eval time before `for` has passed, when it must not fire
    changed: Callable[[dict[Key, float]], dict[Key, str]]
    removed: Callable[[dict[Key, float]], list[Key]] = field(default=lambda s: [])


def _fabric_in_progress(s: dict[Key, float]) -> dict[Key, str]:
    completed = one(s, "gpu_node_installer_gpu_fabric_state", gpu="3")
    return {with_labels(completed, state="in-progress"): f"1x{MINUTES}"}


CASES = [
    Case("GpuNodeNotReady", "15m", "5m",
         lambda s: {one(s, "gpu_node_installer_ready"): f"0x{MINUTES}"}),
    Case("GpuCriticalXid", "2m", None, lambda s: {with_labels(
        one(s, "gpu_node_installer_xid_errors_total"), xid="79"): f"1x{MINUTES}"}),
    Case("GpuDriverInstallFailed", "2m", None, lambda s: {
        one(s, "gpu_node_installer_last_install_exit_code"): f"14x{MINUTES}"}),
    Case("GpuFabricIncomplete", "20m", "10m", _fabric_in_progress,
         lambda s: [one(s, "gpu_node_installer_gpu_fabric_state", gpu="3")]),
    Case("GpuRowRemapFailure", "2m", None, lambda s: {one(
        s, "gpu_node_installer_gpu_remapped_rows", gpu="5", cause="failure"): f"1x{MINUTES}"}),
    Case("GpuMetricsCollectionFailing", "25m", "10m", lambda s: {(
        "gpu_node_installer_collection_errors_total",
        frozenset({**TARGET, "source": "podresources"}.items())): f"0+12x{MINUTES}"}),
    Case("GpuNodeNextKernelWithoutDriver", "40m", "20m",
         lambda s: {next_kernel("missing"): f"0x{MINUTES}"}),
]


def _selector(key: Key) -> str:
    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(key[1]))
    return f"{key[0]}{{{labels}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _input(series: dict[Key, float], changed: dict[Key, str], removed: list[Key]
           ) -> list[dict[str, str]]:
    values = {key: f"{value:.15g}x{MINUTES}" for key, value in series.items()
              if key not in removed}
    values.update(changed)
    return [{"series": _selector(key), "values": text} for key, text in values.items()]


def _render(template: str, labels: dict[str, str], value: float) -> str:
    """Prometheus' alert templating for the two forms the rules use."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return text.replace("{{ $value }}", f"{value:.15g}")


def _expected(case: Case, key: Key, value: float) -> dict[str, Any]:
    """The alert `case` raises from the changed series `key` (value at firing time)."""
    rule = rules()[case.alert]
    labels = {k: v for k, v in key[1]} | rule["labels"]
    if case.alert == "GpuNodeNextKernelWithoutDriver":
        labels.pop("state")  # aggregated away: a retry's state change keeps the clock
    return {"exp_labels": labels, "exp_annotations": {
        name: _render(text, labels, value) for name, text in rule["annotations"].items()}}


def _alerting_value(case: Case, series: dict[Key, float]) -> tuple[Key, float]:
    (key, text), = [(k, v) for k, v in case.changed(series).items()]
    if case.alert == "GpuMetricsCollectionFailing":
        return key, 12 / 60  # rate() per second of +12 a minute
    return key, float(text.split("x")[0])


def _run(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups()}))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([binary("promtool"), "test", "rules", str(tmp_path / "test.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)


def test_no_alert_fires_on_the_recorded_node(tmp_path: Path) -> None:
    series = recorded()
    checks = [{"eval_time": at, "alertname": alert, "exp_alerts": []}
              for alert in ALERTS for at in ("1m", "30m", "59m")]
    result = _run(tmp_path, [{"interval": "1m", "input_series": _input(series, {}, []),
                              "alert_rule_test": checks}])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.alert)
def test_each_alert_fires_on_its_change_only(tmp_path: Path, case: Case) -> None:
    series = recorded()
    key, value = _alerting_value(case, series)
    checks: list[dict[str, Any]] = [{"eval_time": case.fires_at, "alertname": case.alert,
                                     "exp_alerts": [_expected(case, key, value)]}]
    if case.pending_at:
        checks.append({"eval_time": case.pending_at, "alertname": case.alert,
                       "exp_alerts": []})
    checks += [{"eval_time": case.fires_at, "alertname": other, "exp_alerts": []}
               for other in ALERTS if other != case.alert]
    result = _run(tmp_path, [{"interval": "1m", "alert_rule_test": checks,
                              "input_series": _input(series, case.changed(series),
                                                     case.removed(series))}])
    assert result.returncode == 0, result.stdout + result.stderr


def test_next_kernel_retries_keep_the_clock_and_ready_never_fires(tmp_path: Path) -> None:
    """failed (10m) -> building (2m: a retry) -> failed: one pending alert all along, firing
    30 minutes after the first failure; a ready next kernel never fires."""
    series = recorded()
    flapping = {next_kernel("failed"): "0x9 _x2 0x48", next_kernel("building"): "_x10 0x1",
                next_kernel("ready", "6.1.0-59-amd64"): f"1x{MINUTES}"}
    firing = {"exp_labels": {**TARGET, "kernel": "6.1.0-58-amd64", "severity": "warning"}}
    firing["exp_annotations"] = {name: _render(text, firing["exp_labels"], 0)
                                 for name, text in rules()["GpuNodeNextKernelWithoutDriver"][
                                     "annotations"].items()}
    checks = [{"eval_time": "29m", "alertname": "GpuNodeNextKernelWithoutDriver",
               "exp_alerts": []},
              {"eval_time": "31m", "alertname": "GpuNodeNextKernelWithoutDriver",
               "exp_alerts": [firing]}]
    result = _run(tmp_path, [{"interval": "1m", "alert_rule_test": checks,
                              "input_series": _input(series, flapping, [])}])
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_case() -> None:
    assert sorted(rules()) == sorted(ALERTS) == sorted(case.alert for case in CASES)


@pytest.mark.parametrize(("name", "schema"), [("prometheusrule.yaml", PROMETHEUS_RULE),
                                              ("rules.yaml", RULES)])
def test_strictly_valid_for_their_crds(name: str, schema: dict[str, Any]) -> None:
    (doc,) = _docs(name)
    jsonschema.validate(doc, schema)
    broken = copy.deepcopy(doc)  # guards the guard: a misspelt field fails
    broken["spec"]["groups"][0]["rules"][0]["expresion"] = "up"
    with pytest.raises(jsonschema.ValidationError, match="expresion"):
        jsonschema.validate(broken, schema)


def test_both_objects_hold_the_same_rules() -> None:
    (operator,), (managed,) = _docs("prometheusrule.yaml"), _docs("rules.yaml")
    assert operator["spec"] == managed["spec"]
    assert "namespace" not in operator["metadata"] and "namespace" not in managed["metadata"]


def test_rules_use_only_exported_metrics() -> None:
    used: set[str] = set()
    for rule in rules().values():
        no_strings = re.sub(r'"[^"]*"', "", rule["expr"])
        no_labels = re.sub(r"\{[^}]*\}|\[[^]]*\]|(?:by|without) \([^)]*\)", "", no_strings)
        used |= set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", no_labels)) - PROMQL_WORDS
    assert used <= METRICS | {"gpu_node_installer_collection_errors_total"}, used - METRICS


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups()}))
    check = subprocess.run([binary("promtool"), "check", "rules", str(tmp_path / "rules.yaml")],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in check.stdout
