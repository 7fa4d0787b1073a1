"""The PromQL in daemonset/examples/metrics/: the Grafana dashboard's and the
prometheus-adapter rule's, with Grafana's and the adapter's template variables filled in as
they would be at query time, so tests can check them (promtool) and run them (Prometheus)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "daemonset" / "examples" / "metrics"
DASHBOARD = EXAMPLES / "grafana-dashboard.json"
# Grafana's variables as a query sees them: every node, a 1-minute rate window.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$node": ".*"}


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included, rows themselves left out."""
    found = []
    for panel in (board or dashboard())["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def fill(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):  # $__rate_interval before $__r...
        expr = expr.replace(name, variables[name])
    return expr


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title / refId, PromQL ready to run) for every target of every panel."""
    return [(f"{panel['title']} / {target['refId']}", fill(target["expr"], GRAFANA_VARIABLES))
            for panel in panels() for target in panel["targets"]]


def variable_metrics() -> list[str]:
    """The metric each `label_values(metric, label)` template variable reads."""
    found = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["definition"])
            assert match, variable["definition"]
            found.append(match.group(1))
    return found


def adapter_rules() -> list[dict[str, Any]]:
    config_map = yaml.safe_load((EXAMPLES / "adapter-rule.yaml").read_text())
    return list(yaml.safe_load(config_map["data"]["config.yaml"])["rules"])


def adapter_query(rule: dict[str, Any], namespace: str, pods: list[str]) -> str:
    """The metricsQuery as prometheus-adapter expands it for pods of one namespace."""
    series = re.match(r"\s*(\w+)", rule["seriesQuery"])
    assert series, rule["seriesQuery"]
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    return (rule["metricsQuery"].replace("<<.Series>>", series.group(1))
            .replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod"))
