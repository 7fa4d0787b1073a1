"""`install` on a node whose fabric needs Fabric Manager: a package without it is refused
before anything changes, unless FABRIC_MANAGER=host says the node runs it; and `install`
alone (no agent) publishes readiness only once every GPU's fabric completed, waiting for it
with `--fabric-wait`."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
from e2e import KERNEL, NODE, Scene, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer
from native.daemons import COMPLETED, IN_PROGRESS, NOT_STARTED, write_fabric

from installer.errors import IncompatibleError
from installer.testing import SAMPLE_NODES, PciSpec

V1 = "535.261.03"
# the T4 sample node with the NVSwitch functions of an HGX board (class 0x0680, device 22a3)
NVSWITCH_NODE = dataclasses.replace(
    SAMPLE_NODES[NODE],
    pci=(*SAMPLE_NODES[NODE].pci,
         *(PciSpec(f"0000:0{i}:00.0", 0x22A3, 0x068000, driver=None) for i in range(5, 9))))


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    scene = make_scene(tmp_path, NVSWITCH_NODE)
    add_version(scene, V1)
    return scene


def _install(scene: Scene, mirror: str, *extra: str,
             env: dict[str, str] | None = None) -> tuple[int, str]:
    done = run_cli(["install", *scene.args("--mirror", mirror, "--driver-version", V1,
                                           "--allow-http", *extra)],
                   {**standin_env(V1), **(env or {})})
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


def _ready_files(scene: Scene) -> list[Path]:
    return [scene.install_dir / ".ready.json",
            scene.root / "run/nvidia/validations/driver-ready"]


def test_install_alone_publishes_nothing_before_the_fabric_completes(scene: Scene) -> None:
    """At an HGX boot the fabric has not started: the install holds readiness for the agent
    (exit 0, nothing published); with `--fabric-wait` past its bound, exit 12 naming the GPU."""
    fabric = scene.work / "fabric"
    write_fabric(fabric, [(NOT_STARTED, 0)])
    env = {"FAKE_NVML_FABRIC_FILE": str(fabric)}
    with MirrorServer(scene.repo) as server:
        code, stderr = _install(scene, server.url, "--fabric-manager", "host", env=env)
        assert code == 0, stderr
        assert not any(path.exists() for path in _ready_files(scene))
        assert (scene.install_dir / ".agent/ready.json").is_file()  # held for the agent
        code, stderr = _install(scene, server.url, "--fabric-manager", "host",
                                "--fabric-wait", "1", env=env)
    assert code == 12, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error(") and "0000:00:04.0 not-started" in last, last
    assert not any(path.exists() for path in _ready_files(scene))


def test_install_with_fabric_wait_publishes_once_the_fabric_completes(scene: Scene) -> None:
    """Sampled every 20 ms through the whole install: never ready before the fabric
    completed; then ready with the held copy's exact bytes."""
    fabric = scene.work / "fabric"
    write_fabric(fabric, [(NOT_STARTED, 0)])
    samples: list[tuple[bool, bool]] = []  # (published, fabric done)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            done = fabric.read_text().split()[0] == str(COMPLETED)
            samples.append(((scene.install_dir / ".ready.json").exists(), done))
            time.sleep(0.02)

    def train() -> None:  # as Fabric Manager does, once the driver is loaded
        while not (scene.root / "dev/nvidiactl").exists() and not stop.is_set():
            time.sleep(0.05)
        write_fabric(fabric, [(IN_PROGRESS, 0)])
        time.sleep(1.0)
        write_fabric(fabric, [(COMPLETED, 0)])

    threads = [threading.Thread(target=sample), threading.Thread(target=train)]
    for thread in threads:
        thread.start()
    try:
        with MirrorServer(scene.repo) as server:
            code, stderr = _install(scene, server.url, "--fabric-manager", "host",
                                    "--fabric-wait", "60",
                                    env={"FAKE_NVML_FABRIC_FILE": str(fabric)})
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert code == 0, stderr
    assert [i for i, (published, done) in enumerate(samples) if published and not done] == []
    assert any(not done for _, done in samples)  # sampled before the fabric completed
    assert (scene.install_dir / ".ready.json").read_bytes() == \
        (scene.install_dir / ".agent/ready.json").read_bytes()
