"""`install` end to end on an RDMA node: nvidia-peermem loaded or refused, the node condition
gpu-node-installer/RDMAReady, and the GPUs ready (exit 0) either way; `detect`/`status` say
which stack the node runs and why peermem is not loaded."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import KERNEL, NODE, Scene, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer, answering_api

from installer.node.host import Roots
from installer.testing import SAMPLE_NODES, IbSpec, nic_vpd
from installer.testing.kernel import FakeKernelHost, module_file_bytes, write_host_module

V1 = "535.261.03"
PEER = "ib_register_peer_memory_client"
OFED_CRC = 0x11111111
TOKEN = "rdma-test-token"


@pytest.fixture
def api() -> Iterator[tuple[str, list[dict[str, object]]]]:
    with answering_api() as served:
        yield served


def _rdma_scene(tmp_path: Path) -> Scene:
    """The sample node with a ConnectX NIC and the OFED ib_core loaded since boot."""
    spec = dataclasses.replace(SAMPLE_NODES[NODE], infiniband=(
        IbSpec("mlx5_0", "0000:1a:00.0", nic_vpd()),))
    scene = make_scene(tmp_path, spec)
    tree = scene.root / "lib/modules" / KERNEL
    write_host_module(tree, "updates/dkms/ib_core.ko", "ib_core",
                      exports={PEER: OFED_CRC}, srcversion="0FED0FED0FED0FED0FED0FE")
    (tree / "modules.dep").write_text("updates/dkms/ib_core.ko:\n")
    (scene.root / "usr/src/ofa_kernel/x86_64" / KERNEL).mkdir(parents=True)
    host = FakeKernelHost(Roots(scene.root, scene.root / "proc", scene.root / "sys",
                                scene.root / "dev"))
    host.finit_module(tree / "updates/dkms/ib_core.ko", "")
    (scene.root / "sys/module/ib_core/version").write_text("24.10-1.1.4\n")
    return scene


def _install(scene: Scene, crc: int, api: tuple[str, list[dict[str, object]]],
             tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    peermem = module_file_bytes("nvidia_peermem", V1, ["nvidia", "ib_core"],
                                versions={PEER: crc}, kernel_release=KERNEL)
    add_version(scene, V1, extra_modules={"nvidia-peermem.ko": peermem})
    account = tmp_path / "sa"
    account.mkdir(exist_ok=True)
    (account / "token").write_text(TOKEN)
    with MirrorServer(scene.repo) as server:
        done = run_cli(["install", *scene.args(
            "--mirror", server.url, "--driver-version", V1, "--allow-http",
            "--node-name", "gpu-node-1", "--kube-api", api[0],
            "--service-account-dir", str(account), *extra)], standin_env(V1))
    return done.returncode, done.stdout, done.stderr


def _condition(calls: list[dict[str, object]]) -> dict[str, object]:
    patches = [c for c in calls if c["path"] == "/api/v1/nodes/gpu-node-1/status"]
    assert len(patches) == 1, calls
    body = patches[0]["body"]
    assert isinstance(body, dict)
    (condition,) = body["status"]["conditions"]
    assert isinstance(condition, dict)
    return condition


def test_mismatched_peermem_is_refused_and_the_gpus_are_ready(
        tmp_path: Path, api: tuple[str, list[dict[str, object]]]) -> None:
    scene = _rdma_scene(tmp_path)
    code, _, stderr = _install(scene, 0x0BAD0BAD, api, tmp_path)
    assert code == 0, stderr
    ready = json.loads((scene.install_dir / ".ready.json").read_text())
    assert ready["driver_version"] == V1
    assert ready["rdma"]["reason"] == "SymbolVersionMismatch"
    condition = _condition(api[1])
    assert condition["type"] == "gpu-node-installer/RDMAReady"
    assert (condition["status"], condition["reason"]) == ("False", "SymbolVersionMismatch")
    message = str(condition["message"])
    assert "0x0bad0bad" in message and "0x11111111" in message and "24.10-1.1.4" in message
    refusals = [line for line in stderr.splitlines() if "nvidia-peermem refused" in line]
    assert len(refusals) == 1
    assert "nvidia_peermem" not in (scene.root / "proc/modules").read_text()
    status = run_cli(["status", *scene.args()], standin_env(V1))
    assert status.returncode == 0, status.stderr
    assert "RDMA:            MLNX_OFED/DOCA ib_core 24.10-1.1.4; 1 RDMA device(s), " \
           "1 RDMA NIC(s)" in status.stdout
    assert "Optional:        nvidia-peermem not loaded (SymbolVersionMismatch: " \
           in status.stdout


def test_matching_peermem_is_loaded_and_the_condition_is_true(
        tmp_path: Path, api: tuple[str, list[dict[str, object]]]) -> None:
    scene = _rdma_scene(tmp_path)
    code, _, stderr = _install(scene, OFED_CRC, api, tmp_path)
    assert code == 0, stderr
    assert "nvidia_peermem" in (scene.root / "proc/modules").read_text()
    condition = _condition(api[1])
    assert (condition["status"], condition["reason"]) == ("True", "PeermemLoaded")
    status = run_cli(["status", *scene.args("--output", "json")], standin_env(V1))
    report = json.loads(status.stdout)
    assert report["optional"]["nvidia_peermem"]["loaded"] is True
    assert report["node"]["rdma"]["kind"] == "ofed"


def test_detect_on_a_node_without_rdma(tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    done = run_cli(["detect", *scene.args()], standin_env(V1))
    assert done.returncode == 0, done.stderr
    assert "RDMA:            none (ib_core not loaded)" in done.stdout
