"""`install` on a node whose fabric needs Fabric Manager (issue 24): a package without it is
refused before anything changes, unless FABRIC_MANAGER=host says the node runs it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from e2e import KERNEL, NODE, Scene, add_version, run_cli, standin_env
from httpserver import MirrorServer

from installer.errors import IncompatibleError
from installer.testing import SAMPLE_NODES, PciSpec, build_node

V1 = "535.261.03"
# the T4 sample node with the NVSwitch functions of an HGX board (class 0x0680, device 22a3)
NVSWITCH_NODE = dataclasses.replace(
    SAMPLE_NODES[NODE],
    pci=(*SAMPLE_NODES[NODE].pci,
         *(PciSpec(f"0000:0{i}:00.0", 0x22A3, 0x068000, driver=None) for i in range(5, 9))))


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    root = tmp_path / "node"
    root.mkdir()
    build_node(root, NVSWITCH_NODE)
    scene = Scene(root, tmp_path / "repo", tmp_path / "work")
    scene.work.mkdir()
    add_version(scene, V1)
    return scene


def _install(scene: Scene, mirror: str, *extra: str) -> tuple[int, str]:
    done = run_cli(["install", *scene.args("--mirror", mirror, "--driver-version", V1,
                                           "--allow-http", *extra)], standin_env(V1))
    return done.returncode, done.stderr


def test_a_package_without_fabric_manager_is_refused_before_anything_changes(
        scene: Scene) -> None:
    assert SAMPLE_NODES[NODE].kernel == KERNEL
    with MirrorServer(scene.repo) as server:
        code, stderr = _install(scene, server.url)
    assert code == IncompatibleError.code, stderr
    last = stderr.strip().splitlines()[-1]
    assert "nv-fabricmanager" in last and "--fabricmanager" in last, last
    assert "FABRIC_MANAGER=host" in last, last
    assert not (scene.root / "dev" / "nvidiactl").exists()  # nothing loaded
    assert not (scene.install_dir / "lib64").exists()  # nothing staged
    assert not (scene.install_dir / ".ready.json").exists()


def test_fabric_manager_host_installs_and_leaves_the_fabric_to_the_node(scene: Scene) -> None:
    with MirrorServer(scene.repo) as server:
        code, stderr = _install(scene, server.url, "--fabric-manager", "host")
    assert code == 0, stderr
    assert (scene.install_dir / ".ready.json").is_file()


def test_a_bad_fabric_manager_value_is_one_line_exit_2(scene: Scene) -> None:
    code, stderr = _install(scene, "http://127.0.0.1:9/", "--fabric-manager", "maybe")
    assert code == 2
    assert "FABRIC_MANAGER" in stderr or "--fabric-manager" in stderr
    assert not (scene.install_dir / ".lock").exists()
