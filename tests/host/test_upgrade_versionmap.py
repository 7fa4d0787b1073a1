"""DRIVER_VERSION_MAP: a driver version per node pool from one DaemonSet, chosen at start
from the Node's labels (the strict fake API, tests/kubefake.py), shown by `status`,
`versions` and the rule label; changing a pool's entry upgrades that pool alone, one node
at a time, through the live upgrade that a changed NVIDIA_DRIVER_VERSION runs.

Same scene as tests/host/test_upgrade.py (nodes serving V1 over the simulated kernel, a
mirror with V1 and V2); its helpers are imported from there.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import kubefake
import pytest
from e2e import Scene, make_scene, run_cli, standin_env
from host import test_upgrade as shared
from host.test_upgrade import UID, V1, V2, account, install, kernel, loaded, pod_cgroup
from httpserver import MirrorServer
from kubefake import Cluster, node_doc, pod_doc

repo = shared.repo

POOL = "cloud.google.com/gke-nodepool"
OVERRIDE = "gpu-node-installer/driver-version.override"
RULE = "gpu-node-installer/driver-version.rule"
MANAGED = "gpu-node-installer/driver-version"
STATE = kubefake.STATE


@pytest.fixture
def mirror(repo: Path) -> Iterator[str]:
    with MirrorServer(repo) as server:
        yield server.url


def serving_v1(base: Path, mirror: str) -> Scene:
    base.mkdir()
    scene = make_scene(base)
    first = install(scene, mirror, V1)
    assert first.returncode == 0, first.stderr
    return scene


def write_map(scene: Scene, pools: dict[str, str]) -> Path:
    path = scene.work / "version-map.yaml"
    path.write_text("".join(f"- selector: {{{POOL}: {pool}}}\n  version: '{version}'\n"
                            for pool, version in pools.items()))
    return path


def with_map(scene: Scene, command: str, node: str, api: str, map_path: Path,
             version: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`command` for `node` with the map; NVIDIA_DRIVER_VERSION stays V1 (the fallback);
    the NVML stand-in reports `version` (what the kernel would load)."""
    return run_cli([command, *scene.args(
        "--mirror", mirror_of(scene), "--allow-http", "--driver-version", V1,
        "--driver-version-map", str(map_path), "--node-name", node, "--kube-api", api,
        "--service-account-dir", str(account(scene)), "--output", "json", *extra)],
        standin_env(version))


_MIRRORS: dict[Path, str] = {}


def mirror_of(scene: Scene) -> str:
    return _MIRRORS[scene.root]


def pool_node(name: str, pool: str) -> dict[str, object]:
    doc = node_doc(name)
    doc["metadata"].setdefault("labels", {})[POOL] = pool  # type: ignore[index]
    return doc


@pytest.fixture
def node(tmp_path: Path, mirror: str) -> Scene:
    scene = serving_v1(tmp_path / "n", mirror)
    _MIRRORS[scene.root] = mirror
    return scene


class TestChoice:
    def test_the_pools_entry_chooses_and_status_versions_and_the_label_say_so(
            self, node: Scene) -> None:
        cluster = Cluster(node_name="a-1", nodes={"a-1": pool_node("a-1", "h200-pool")})
        map_path = write_map(node, {"a100-pool": V1, "h200-pool": V2})
        with kubefake.serve(cluster) as api:
            done = with_map(node, "install", "a-1", api, map_path, V2)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["driver_version"] == V2
            status = with_map(node, "status", "a-1", api, map_path, V2)
            versions = with_map(node, "versions", "a-1", api, map_path, V2)
            text = run_cli(["status", *node.args(
                "--driver-version", V1, "--driver-version-map", str(map_path),
                "--node-name", "a-1", "--kube-api", api,
                "--service-account-dir", str(account(node)))], standin_env(V2))
        assert loaded(node) == V2  # idle node: installed as usual
        labels = cluster.node()["metadata"]["labels"]
        assert labels[MANAGED] == V2 and labels[RULE] == "map-2"
        reason = f"DRIVER_VERSION_MAP entry 2 ({POOL}=h200-pool)"
        assert json.loads(status.stdout)["requested"] == {
            "version": V2, "flavour": "auto", "rule": "map-2", "reason": reason}
        assert f"Requested:       {V2} ({reason})" in text.stdout.splitlines()
        chosen = json.loads(versions.stdout)
        assert chosen["requested"] == V2 and chosen["resolved"].startswith(V2)
        assert chosen["rule"]["rule"] == "map-2"
        assert cluster.errors == []

    def test_the_node_label_overrides_the_map_and_no_match_falls_back(
            self, node: Scene) -> None:
        cluster = Cluster(node_name="a-1", nodes={"a-1": pool_node("a-1", "h200-pool")})
        map_path = write_map(node, {"h200-pool": V2})
        cluster.node()["metadata"]["labels"][OVERRIDE] = V1
        with kubefake.serve(cluster) as api:
            pinned = with_map(node, "install", "a-1", api, map_path, V1)
            assert pinned.returncode == 0, pinned.stderr
            assert json.loads(pinned.stdout)["fast_path"] is True  # V1 kept: the label chose
            labels = cluster.node()["metadata"]["labels"]
            assert labels[RULE] == "label" and labels[OVERRIDE] == V1  # signal keeps it
            del cluster.node()["metadata"]["labels"][OVERRIDE]
            cluster.node()["metadata"]["labels"][POOL] = "other-pool"
            fallback = with_map(node, "install", "a-1", api, map_path, V1)
        assert fallback.returncode == 0, fallback.stderr
        assert json.loads(fallback.stdout)["fast_path"] is True
        assert cluster.node()["metadata"]["labels"][RULE] == "setting"
        assert loaded(node) == V1
        assert cluster.states() == []  # nothing was upgraded

    def test_a_bad_override_label_is_refused_naming_it(self, node: Scene) -> None:
        cluster = Cluster(node_name="a-1", nodes={"a-1": pool_node("a-1", "h200-pool")})
        cluster.node()["metadata"]["labels"][OVERRIDE] = "newest"
        map_path = write_map(node, {"h200-pool": V2})
        with kubefake.serve(cluster) as api:
            done = with_map(node, "install", "a-1", api, map_path, V1)
        assert done.returncode == 2, done.stderr
        assert f"node label {OVERRIDE}='newest' is not a branch or version" in done.stderr
        assert [c.method for c in cluster.calls] == ["GET"]  # nothing written
        assert loaded(node) == V1

    def test_an_unreadable_node_is_not_guessed(self, node: Scene) -> None:
        cluster = Cluster(node_name="a-1", nodes={"a-1": pool_node("a-1", "h200-pool")})
        cluster.faults["GET /api/v1/nodes/a-1"] = [403]
        map_path = write_map(node, {"h200-pool": V2})
        with kubefake.serve(cluster) as api:
            done = with_map(node, "install", "a-1", api, map_path, V1)
        assert done.returncode == 15, done.stderr
        assert "labels of node a-1 could not be read" in done.stderr
        assert all(c.method == "GET" for c in cluster.calls)
        assert loaded(node) == V1


def busy(scene: Scene, name: str, uid: str) -> int:
    """A training pod's process holding the GPU on `scene`'s node."""
    return kernel(scene).open_device("nvidia", "/dev/nvidia0", "python3", pod_cgroup(uid))


def cordoned_at_once(cluster: Cluster) -> int:
    """The most nodes cordoned at one instant, from the order of the Node patches."""
    cordoned: set[str] = set()
    most = 0
    for call in cluster.calls:
        if call.method != "PATCH" or not call.path.startswith("/api/v1/nodes/"):
            continue
        spec = (call.body or {}).get("spec") or {}
        if "unschedulable" in spec:
            name = call.path.split("/")[4]
            (cordoned.add if spec["unschedulable"] else cordoned.discard)(name)
            most = max(most, len(cordoned))
    return most


class TestPoolEntryChange:
    def test_changing_one_entry_upgrades_that_pool_one_node_at_a_time(
            self, tmp_path: Path, mirror: str) -> None:
        """Pool a (2 nodes, busy) and pool b (1 node, busy), both on V1 by their entries;
        pool a's entry becomes V2 and every installer pod restarts at once (the DaemonSet's template
        changed): a's nodes are upgraded one at a time (max-unavailable 1), b's is not
        touched (the fast path: no state label, no cordon, no eviction)."""
        scenes = {name: serving_v1(tmp_path / name, mirror) for name in ("a-1", "a-2", "b-1")}
        uids = {"a-1": UID, "a-2": "1a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d",
                "b-1": "2a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"}
        pids = {name: busy(scene, name, uids[name]) for name, scene in scenes.items()}
        pods = {f"default/train-{n}": pod_doc(f"train-{n}", uids[n], n) for n in scenes}
        cluster = Cluster(node_name="a-1", pods=pods, nodes={
            "a-1": pool_node("a-1", "a"), "a-2": pool_node("a-2", "a"),
            "b-1": pool_node("b-1", "b")})
        for name, scene in scenes.items():
            cluster.nodes[name]["metadata"]["labels"][MANAGED] = V1
            _MIRRORS[scene.root] = mirror

        def kubelet(pod: dict[str, object]) -> None:
            name = pod["metadata"]["name"].removeprefix("train-")  # type: ignore[index]
            kernel(scenes[name]).close_device(pids[name])

        cluster.on_evict = kubelet
        with kubefake.serve(cluster) as api:  # before: both entries say V1
            for name, scene in scenes.items():
                before = with_map(scene, "install", name, api, write_map(
                    scene, {"a": V1, "b": V1}), V1, "--upgrade-policy", "evict")
                assert before.returncode == 0, before.stderr
                assert json.loads(before.stdout)["fast_path"] is True
        assert cluster.nodes["a-1"]["metadata"]["labels"][RULE] == "map-1"
        assert cordoned_at_once(cluster) == 0 and cluster.states() == []
        maps = {name: write_map(scene, {"a": V2, "b": V1})  # pool a's entry changes
                for name, scene in scenes.items()}
        results: dict[str, subprocess.CompletedProcess[str]] = {}

        def run(name: str, api: str) -> None:
            results[name] = with_map(
                scenes[name], "install", name, api, maps[name],
                V2 if name.startswith("a") else V1, "--upgrade-policy", "evict",
                "--upgrade-max-unavailable", "1", "--upgrade-timeout", "60")

        with kubefake.serve(cluster) as api:
            threads = [threading.Thread(target=run, args=(name, api)) for name in scenes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(150)
        for name, done in results.items():
            assert done.returncode == 0, (name, done.stderr[-3000:])
        assert len(results) == 3
        assert loaded(scenes["a-1"]) == V2 and loaded(scenes["a-2"]) == V2
        assert loaded(scenes["b-1"]) == V1
        assert json.loads(results["b-1"].stdout)["fast_path"] is True
        assert cordoned_at_once(cluster) == 1
        b_patches = [c for c in cluster.calls
                     if c.method != "GET" and "b-1" in c.path]
        assert all("unschedulable" not in ((c.body or {}).get("spec") or {})
                   and STATE not in (((c.body or {}).get("metadata") or {}).get("labels")
                                     or {}) for c in b_patches)
        assert "default/train-b-1" in cluster.pods
        assert "default/train-a-1" not in cluster.pods
        assert "default/train-a-2" not in cluster.pods
        for name in ("a-1", "a-2"):
            labels = cluster.nodes[name]["metadata"]["labels"]
            assert labels[STATE] == "upgrade-done" and labels[MANAGED] == V2
            assert labels[RULE] == "map-1"
        assert cluster.nodes["b-1"]["metadata"]["labels"][RULE] == "map-2"
        assert STATE not in cluster.nodes["b-1"]["metadata"]["labels"]
        assert cluster.errors == []


class TestOrder:
    """The documented order, on parsed maps (no node needed)."""

    MAP = (f"- {{selector: {{{POOL}: h200-pool, tier: prod}}, version: '570', "
           "flavour: open}\n"
           f"- {{selector: {{{POOL}: h200-pool}}, version: '560'}}\n"
           "- {selector: {tier: prod}, version: 535.261.03}\n")

    def choose(self, labels: dict[str, str]) -> tuple[str, str, str]:
        from installer.config import Config
        from installer.upgrade.versionmap import parse, resolve

        config = Config(driver_version="550", flavour="proprietary", node_name="n")
        choice = resolve(config, parse(self.MAP), labels)
        return choice.version, choice.flavour, choice.rule

    def test_first_matching_entry_wins_in_file_order(self) -> None:
        assert self.choose({POOL: "h200-pool", "tier": "prod"}) == ("570", "open", "map-1")
        assert self.choose({POOL: "h200-pool"}) == ("560", "proprietary", "map-2")
        assert self.choose({"tier": "prod", POOL: "a100"}) == (V1, "proprietary", "map-3")

    def test_every_selector_label_must_match(self) -> None:
        assert self.choose({POOL: "h200-pool", "tier": "dev"}) == ("560", "proprietary",
                                                                   "map-2")
        assert self.choose({}) == ("550", "proprietary", "setting")

    def test_the_override_label_comes_first(self) -> None:
        labels = {POOL: "h200-pool", "tier": "prod", OVERRIDE: V2}
        assert self.choose(labels) == (V2, "proprietary", "label")
