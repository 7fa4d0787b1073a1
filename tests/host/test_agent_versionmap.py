"""DRIVER_VERSION_MAP watched by the running agent: when the map (the kubelet rewrites a
mounted ConfigMap's file in place) or the node's override label chooses another driver than
the running install was asked for, the real `agent` says so once and, under a live-upgrade
policy, deletes its own pod (UID precondition) so that its successor's install upgrades the
node; under `refuse` it labels the node upgrade-required and keeps serving. The map is
resolved by the install's own code (installer/upgrade/versionmap.py) against the strict fake
API (tests/kubefake.py); the pod deletion is checked as the API server checks it."""

from __future__ import annotations

import json
from pathlib import Path

import kubefake
from agentnode import NODE, VERSION, AgentNode, make_node, wait_for
from kubedocs import pod_doc
from kubefake import Cluster, node_doc

from installer.agent.versionwatch import VersionWatch
from installer.installdir.state import InstallState, read_state, write_state
from installer.packages.manifest import Package

POOL = "cloud.google.com/gke-nodepool"
OVERRIDE = "gpu-node-installer/driver-version.override"
UPGRADE_STATE = "gpu-node-installer/upgrade-state"
POD = ("gpu-node-installer", "gpu-node-installer-x7k2p", "7d0c6c2e-8f1e-4c55-9a0b-2b4f4c1d0e11")


def map_node(tmp_path: Path, package: Package, entry: str, policy: str) -> AgentNode:
    """A ready node whose install was asked for VERSION by map entry 1 of pool `a100`."""
    map_file = tmp_path / "versions.yaml"
    map_file.write_text(f"- selector: {{{POOL}: a100}}\n  version: '{entry}'\n")
    node = make_node(tmp_path, package)
    node.env.update({"DRIVER_VERSION_MAP": str(map_file), "NVIDIA_DRIVER_VERSION": VERSION,
                     "UPGRADE_POLICY": policy, "POD_NAMESPACE": POD[0], "POD_NAME": POD[1],
                     "POD_UID": POD[2]})
    write_state(node.install, InstallState("0.1.0", VERSION, "auto", "6.1.0-26-cloud-amd64",
                                           VERSION, "proprietary", "0" * 64))
    return node


def deletes(cluster: Cluster) -> list[str]:
    return [step for step in cluster.steps() if step.startswith("delete")]


def a_cluster(labels: dict[str, str]) -> Cluster:
    doc = node_doc(NODE)
    doc["metadata"].setdefault("labels", {}).update(labels)  # type: ignore[union-attr]
    pod = pod_doc(POD[1], POD[2], NODE, namespace=POD[0], owner="DaemonSet")
    return Cluster(nodes={NODE: doc}, pods={f"{POD[0]}/{POD[1]}": pod})


def test_a_changed_entry_restarts_the_pod_under_evict(tmp_path: Path,
                                                      package: Package) -> None:
    node = map_node(tmp_path, package, "570", "evict")
    cluster = a_cluster({POOL: "a100"})
    with kubefake.serve(cluster) as api, node.agent(api=api):
        wait_for(lambda: deletes(cluster), 60)
        wait_for(lambda: cluster.events, 30)
    assert deletes(cluster) == [f"delete:{POD[1]}:200"], cluster.steps()
    deletion = next(c for c in cluster.calls if c.method == "DELETE")
    assert deletion.body["preconditions"] == {"uid": POD[2]}  # type: ignore[index]
    [event] = [e for e in cluster.events if e["reason"] == "DriverVersionChanged"]
    assert "now chooses 570 (auto)" in event["message"] and VERSION in event["message"]
    assert f"deleting this pod {POD[0]}/{POD[1]}" in event["message"]
    assert event["type"] == "Normal" and not cluster.errors
    state = read_state(node.install)  # the successor's install upgrades; this one changed none
    assert state is not None and state.requested_version == VERSION


def test_refuse_labels_and_keeps_serving(tmp_path: Path, package: Package) -> None:
    node = map_node(tmp_path, package, VERSION, "refuse")
    cluster = a_cluster({POOL: "a100", OVERRIDE: "550.163.01"})  # the override label wins
    with kubefake.serve(cluster) as api, node.agent(api=api):
        wait_for(lambda: cluster.states(), 60)
        wait_for(lambda: cluster.events, 30)
        wait_for(lambda: node.ready() and node.view().get("ready"), 60)  # still serving
    assert cluster.states() == ["upgrade-required"]
    assert f"{POD[0]}/{POD[1]}" in cluster.pods  # not deleted
    [event] = [e for e in cluster.events if e["reason"] == "DriverVersionChanged"]
    assert "550.163.01" in event["message"] and "UPGRADE_POLICY=refuse" in event["message"]
    assert event["type"] == "Warning"


def test_an_unchanged_map_does_nothing(tmp_path: Path, package: Package) -> None:
    node = map_node(tmp_path, package, VERSION, "evict")
    cluster = a_cluster({POOL: "a100"})
    with kubefake.serve(cluster) as api, node.agent(api=api):
        wait_for(lambda: node.view().get("ready"), 60)
        wait_for(lambda: any(c.path.endswith(f"/nodes/{NODE}") and c.method == "GET"
                             for c in cluster.calls), 30)  # the map was resolved
    assert deletes(cluster) == [] and cluster.states() == []
    assert not [e for e in cluster.events if e["reason"] == "DriverVersionChanged"]


class Picks:
    """A `choose` that answers what the test sets, or refuses."""

    def __init__(self) -> None:
        self.version, self.flavour, self.reason = VERSION, "auto", "map entry 1"
        self.error: Exception | None = None

    def __call__(self) -> Picks:
        if self.error is not None:
            raise self.error
        return self


def test_each_new_choice_once_and_a_bad_map_logged_once(tmp_path: Path) -> None:
    from installer.errors import ConfigError

    write_state(tmp_path, InstallState("0.1.0", VERSION, "auto", "k", VERSION, "open", "0"))
    now, lines = [0.0], []
    picks = Picks()
    log = type("Log", (), {"warning": lambda self, event, **f: lines.append(f["detail"])})()
    watch = VersionWatch(tmp_path, picks, log, clock=lambda: now[0])

    def after(seconds: float) -> object:
        now[0] += seconds
        return watch.check()

    assert after(0) is None
    picks.version = "570"
    assert after(10) is None  # not due yet: the kubelet refreshes about once a minute
    changed = after(60)
    assert changed is not None and changed.wanted == ("570", "auto")
    assert after(60) is None  # said once
    picks.error = ConfigError("DRIVER_VERSION_MAP entry 1: bad version", remedy="fix it")
    assert after(60) is None and after(60) is None
    assert lines == ["DRIVER_VERSION_MAP entry 1: bad version"]
    picks.error, picks.version = None, VERSION
    assert after(60) is None  # back to what runs
    picks.version = "570"
    assert after(60) is not None  # a change again is news again
    (tmp_path / "state.json").unlink(missing_ok=True)
    assert json.dumps(changed.describe())  # a plain string
