"""The upgrade.skip label keeps a node serving (busy or idle),
readiness is withdrawn only once the driver is replaced, the parallel limit counts every
unavailable node of the installer's, and an idle or fresh node ends `upgrade-done`.

Same scene as tests/host/test_upgrade.py (a node serving V1 over the simulated kernel, a
mirror with V1 and V2, the strict fake API server); its helpers are imported from there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import kubefake
import pytest
from e2e import Scene, make_scene, run_cli, standin_env
from host import test_upgrade as shared
from host.test_upgrade import (
    NODE,
    UID,
    V1,
    V2,
    account,
    cluster_with,
    install,
    kernel,
    loaded,
    reasons,
    training,
    upgrade,
)
from httpserver import MirrorServer
from kubefake import Cluster, node_doc, pod_doc

from installer.errors import UpgradeBlockedError, UpgradeWaitingError

# the fixtures: V1 and V2 packages built once for this module; a node serving V1 (installed
# the ordinary way, no API) and a mirror holding both
repo, scene = shared.repo, shared.scene

SKIP = "gpu-node-installer/upgrade.skip"
STATE = kubefake.STATE
MANAGED = "gpu-node-installer/driver-version"
ENV_FILE = "run/nvidia/validations/driver-ready"


@pytest.fixture
def mirror(repo: Path) -> Iterator[str]:
    with MirrorServer(repo) as server:
        yield server.url


def served(scene: Scene) -> dict[str, tuple[int, int, int]]:
    """Every entry of the install dir that serves (staged tree, links, state, readiness)
    and the env file, as (inode, mtime, size): a rewrite, even of the same bytes, shows.
    Not what every run writes: the lock, the cache, the skip record, how the run ended."""
    entries = {}
    paths = [p for p in scene.install_dir.rglob("*")
             if not p.relative_to(scene.install_dir).parts[0].startswith(
                 (".cache", ".lock", ".skipped", ".last-install"))]
    for path in [*paths, scene.root / ENV_FILE]:
        info = path.lstat()
        entries[str(path.relative_to(scene.root))] = (info.st_ino, info.st_mtime_ns,
                                                      info.st_size)
    return entries


def readiness(scene: Scene) -> tuple[bytes, bytes]:
    return ((scene.install_dir / ".ready.json").read_bytes(),
            (scene.root / ENV_FILE).read_bytes())


def status(scene: Scene) -> tuple[str, dict[str, object]]:
    text = run_cli(["status", *scene.args()], standin_env(V1))
    as_json = run_cli(["status", *scene.args("--output", "json")], standin_env(V1))
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    return text.stdout, json.loads(as_json.stdout)


def skip_label(cluster: Cluster) -> None:
    cluster.node()["metadata"]["labels"][SKIP] = "true"


def busy_and_labelled(scene: Scene) -> tuple[Cluster, int]:
    """A training pod holding the GPU (evicting it ends the process); the node labelled."""
    cluster, pid = training(scene)
    skip_label(cluster)
    return cluster, pid


def assert_kept(scene: Scene, cluster: Cluster, done_stdout: str,
                before: dict[str, tuple[int, int, int]], ready: tuple[bytes, bytes]) -> None:
    """Exit 0 checked by the caller; V1 serves, nothing of it rewritten, all told."""
    assert loaded(scene) == V1
    assert served(scene) == before
    assert readiness(scene) == ready
    assert json.loads(done_stdout)["skipped"] == {"wanted": V2, "serving": V1, "label": SKIP}
    assert cluster.errors == []
    skipped = [e for e in cluster.events if e["reason"] == "DriverUpgradeSkipped"]
    assert len(skipped) == 1 and f"wanted {V2}, serving {V1}" in skipped[0]["message"]
    text, report = status(scene)
    assert (f"Upgrade:         wanted {V2}, serving {V1}, skipped by label {SKIP}"
            in text.splitlines())
    assert report["upgrade"] == {"wanted": V2, "serving": V1, "skipped_by": SKIP}
    assert report["readiness"]["ready"] is True  # type: ignore[index]


def skipped_upgrade(scene: Scene, mirror: str, cluster: Cluster, api: str) -> None:
    """An evict-policy run on a labelled node: exit 0, V1 kept, only upgrade-skipped set."""
    before, ready = served(scene), readiness(scene)
    done = upgrade(scene, mirror, api)
    assert done.returncode == 0, done.stderr
    assert_kept(scene, cluster, done.stdout, before, ready)
    assert cluster.steps() == ["patch:upgrade-skipped:-"]


class TestSkipLabel:
    def test_an_idle_node_keeps_its_driver_then_upgrades_once_the_label_goes(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster = cluster_with(node)
        skip_label(cluster)
        with kubefake.serve(cluster) as api:
            skipped_upgrade(node, mirror, cluster, api)
            assert cluster.node()["metadata"]["labels"][STATE] == "upgrade-skipped"
            # the runbook: remove the label, delete the pod (here: run again)
            del cluster.node()["metadata"]["labels"][SKIP]
            again = upgrade(node, mirror, api)
        assert again.returncode == 0, again.stderr
        assert loaded(node) == V2
        assert cluster.states() == ["upgrade-skipped", "upgrade-done"]
        assert cluster.node()["metadata"]["labels"][MANAGED] == V2
        assert "unschedulable" not in cluster.node()["spec"]
        assert status(node)[1]["upgrade"] is None

    def test_a_busy_node_keeps_its_driver_and_its_pods(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, pid = busy_and_labelled(node)
        with kubefake.serve(cluster) as api:
            skipped_upgrade(node, mirror, cluster, api)
        assert "default/train" in cluster.pods and (node.root / "proc" / str(pid)).exists()

    def test_refuse_honours_the_label_without_a_state_label(
            self, scene: tuple[Scene, str]) -> None:
        """Under refuse a busy node used to exit 10 (a crash-looping pod); with the label
        it keeps serving. Nothing else writes upgrade-state under refuse, so neither does
        the skip: only the Event and `status` tell."""
        node, mirror = scene
        cluster, _ = busy_and_labelled(node)
        before, ready = served(node), readiness(node)
        with kubefake.serve(cluster) as api:
            done = install(node, mirror, V2, "--node-name", NODE, "--kube-api", api,
                           "--service-account-dir", str(account(node)))
        assert done.returncode == 0, done.stderr
        assert_kept(node, cluster, done.stdout, before, ready)
        assert cluster.steps() == [] and STATE not in cluster.node()["metadata"]["labels"]

    def test_an_unreachable_api_warns_and_upgrades_as_before(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        done = upgrade(node, mirror, "http://127.0.0.1:9")
        assert done.returncode == 0, done.stderr
        assert f"{SKIP} not read: the driver is replaced as without it" in done.stderr
        assert loaded(node) == V2


    def test_a_label_read_late_blocks_before_anything_is_touched(
            self, scene: tuple[Scene, str]) -> None:
        """The first read fails (warning), the live upgrade's own read sees the label: it
        stops there (exit 15, nothing cordoned or evicted); the next run skips."""
        node, mirror = scene
        cluster, _ = busy_and_labelled(node)
        cluster.faults[f"GET /api/v1/nodes/{NODE}"] = [503]
        ready = readiness(node)
        with kubefake.serve(cluster) as api:
            blocked = upgrade(node, mirror, api)
            assert blocked.returncode == UpgradeBlockedError.code, blocked.stderr
            assert f"{SKIP} not read" in blocked.stderr
            assert f"labelled {SKIP}=true" in blocked.stderr
            assert cluster.node()["spec"].get("unschedulable") is None
            assert readiness(node) == ready and loaded(node) == V1
            again = upgrade(node, mirror, api)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["skipped"]["serving"] == V1
        assert not any(s.startswith(("evict:", "delete:")) for s in cluster.steps())
        assert "default/train" in cluster.pods and loaded(node) == V1


class TestReadinessWithdrawnLate:
    def test_a_refused_plan_never_withdraws_readiness(self, scene: tuple[Scene, str]) -> None:
        """Exit 15 at the plan: readiness stayed in place all along (not withdrawn and put
        back): the API calls saw it at every instant, and it is the same file after."""
        node, mirror = scene
        kernel(node).open_device("nvidia", "/dev/nvidia0", "nvidia-smi",
                                 "0::/system.slice/monitoring.service\n")
        cluster = cluster_with(node, pod_doc("train", UID, NODE))
        ready_file = node.install_dir / ".ready.json"
        cluster.observe = lambda: f"{loaded(node)} ready={ready_file.exists()}"
        files = (ready_file, node.root / ENV_FILE)
        before, ready = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files], readiness(node)
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == UpgradeBlockedError.code, done.stderr
        assert cluster.calls and {c.observed for c in cluster.calls} == {f"{V1} ready=True"}
        assert [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files] == before
        assert readiness(node) == ready

    def test_readiness_goes_only_when_the_driver_is_replaced(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, _ = training(node)
        ready_file = node.install_dir / ".ready.json"
        cluster.observe = lambda: f"{loaded(node)} ready={ready_file.exists()}"
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        before_unload = [c.observed for c in cluster.calls if c.observed.startswith(V1)]
        assert before_unload and set(before_unload) == {f"{V1} ready=True"}  # while evicting
        assert json.loads(ready_file.read_text())["driver_version"] == V2


class TestParallelLimit:
    def test_foreign_cordons_and_not_ready_nodes_count(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, _ = training(node)
        cluster.nodes.update({
            "gpu-node-2": node_doc("gpu-node-2", {MANAGED: V1}, cordoned=True),
            "gpu-node-3": node_doc("gpu-node-3", {MANAGED: V1}, ready=False),
            "gpu-node-4": node_doc("gpu-node-4", {MANAGED: V1}),
            "cpu-node-1": node_doc("cpu-node-1", cordoned=True)})  # not the installer's
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-timeout", "0.5",
                           "--upgrade-max-unavailable", "2")
            assert done.returncode == UpgradeWaitingError.code, done.stderr
            assert "2 other node(s) are unavailable or upgrading: gpu-node-2 (cordoned), " \
                   "gpu-node-3 (NotReady)" in done.stderr
            assert "cpu-node-1" not in done.stderr and "gpu-node-4" not in done.stderr
            assert cluster.node()["spec"].get("unschedulable") is None
            assert "default/train" in cluster.pods and loaded(node) == V1
            wider = upgrade(node, mirror, api, "--upgrade-max-unavailable", "3")
        assert wider.returncode == 0, wider.stderr
        assert loaded(node) == V2
        assert cluster.nodes["gpu-node-2"]["spec"]["unschedulable"] is True  # theirs, kept


class TestUpgradeDone:
    def test_an_idle_node_upgraded_is_labelled_done(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster = cluster_with(node)
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        assert loaded(node) == V2
        assert cluster.states() == ["upgrade-done"]
        assert "unschedulable" not in cluster.node()["spec"] and cluster.errors == []
        assert reasons(cluster)[-1] == "DriverUpgradeDone"

    def test_a_fresh_install_is_labelled_done(self, tmp_path: Path, mirror: str) -> None:
        node = make_scene(tmp_path)
        cluster = cluster_with(node)
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api)
        assert done.returncode == 0, done.stderr
        assert loaded(node) == V2 and cluster.states() == ["upgrade-done"]
        assert cluster.errors == []


def test_the_fake_lists_nodes_with_their_conditions(tmp_path: Path) -> None:
    """Guards the guard: the Node documents carry the Ready condition the limit reads."""
    from installer.node import kube

    (tmp_path / "token").write_text(kubefake.TOKEN)
    cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE),
                                             "n2": node_doc("n2", ready=False)})
    with kubefake.serve(cluster) as url:
        api = kube.api_server(url, tmp_path, {})
        assert api is not None
        conditions = {n["metadata"]["name"]: n["status"]["conditions"][0]["status"]
                      for n in kube.list_items(api, "/api/v1/nodes")}
    assert conditions == {NODE: "True", "n2": "Unknown"}
