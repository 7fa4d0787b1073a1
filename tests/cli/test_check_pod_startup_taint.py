"""`check-pod` and the installer's startup taint (gpu-node-installer/driver-not-ready): a GPU
pod need not tolerate it (the node agent removes it once the driver is ready), a pod that
tolerates it is warned, and a Node that still carries it is explained as not ready yet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from installer.cli import cli

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
STARTUP = {"key": "gpu-node-installer/driver-not-ready", "effect": "NoSchedule"}


@pytest.fixture(autouse=True)
def _termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))


def check(tmp_path: Path, pod: dict[str, Any], *node_taints: dict[str, str],
          strict: bool = False) -> tuple[Result, dict[str, Any]]:
    """check-pod on the pod (and on node-l4.yaml carrying `node_taints`, when given)."""
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    args = [str(tmp_path / "pod.json"), "--output", "json", *(["--strict"] if strict else [])]
    if node_taints:
        node = yaml.safe_load((WORKLOADS / "node-l4.yaml").read_text())
        node["spec"]["taints"] = [*node["spec"]["taints"], *node_taints]
        (tmp_path / "node.yaml").write_text(yaml.safe_dump(node))
        args += ["--node-labels", str(tmp_path / "node.yaml")]
    done = CliRunner().invoke(cli, ["check-pod", *args])
    report = json.loads(done.stdout)
    (rule,) = [r for r in report["workloads"][0]["rules"] if r["rule"] == "toleration"]
    return done, rule


def pod() -> dict[str, Any]:
    return yaml.safe_load((WORKLOADS / "pod.yaml").read_text())


def test_a_gpu_pod_need_not_tolerate_it() -> None:
    """Without a Node: the startup taint is not among the taints a GPU pod must tolerate."""
    tolerations = pod()["spec"]["tolerations"]
    assert not any(t.get("key") == STARTUP["key"] for t in tolerations)


def test_tolerating_it_is_a_warning(tmp_path: Path) -> None:
    workload = pod()
    workload["spec"]["tolerations"].append({**STARTUP, "operator": "Exists"})
    done, rule = check(tmp_path, workload)
    assert done.exit_code == 0 and rule["status"] == "warn", done.output
    assert "tolerating the startup taint lets the pod land before the driver is ready" in \
        rule["why"]
    assert "drop the toleration that matches gpu-node-installer/driver-not-ready" in rule["fix"]
    done, _ = check(tmp_path, workload, strict=True)
    assert done.exit_code == 14


def test_a_catch_all_toleration_tolerates_it_too(tmp_path: Path) -> None:
    workload = pod()
    workload["spec"]["tolerations"] = [{"operator": "Exists"}]
    _, rule = check(tmp_path, workload)
    assert rule["status"] == "warn" and "tolerates the startup taint" in rule["why"]


def test_a_node_that_carries_it_is_not_ready_yet(tmp_path: Path) -> None:
    done, rule = check(tmp_path, pod(), STARTUP)
    assert done.exit_code == 0, done.output  # not a failure of the pod: the node's state
    assert rule["status"] == "warn"
    assert "the node carries the startup taint gpu-node-installer/driver-not-ready:NoSchedule: "\
           "its driver is not ready yet" in rule["why"]
    assert "gpu-node-installer/DriverReady" in rule["fix"]


def test_a_node_without_it_passes(tmp_path: Path) -> None:
    done, rule = check(tmp_path, pod())
    assert rule["status"] == "pass" and "startup taint" not in rule["why"], done.output


def test_another_missing_toleration_still_fails(tmp_path: Path) -> None:
    done, rule = check(tmp_path, pod(), STARTUP,
                       {"key": "dedicated", "value": "ml", "effect": "NoSchedule"})
    assert done.exit_code == 14 and rule["status"] == "fail"
    assert "dedicated=ml:NoSchedule" in rule["why"] and "not ready yet" in rule["why"]
    assert "driver-not-ready" not in rule["fix"]  # the fix is the other taint's toleration
