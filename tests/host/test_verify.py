"""verify: the real pynvml and ctypes over C stand-ins of libnvidia-ml and libcuda.

The stand-ins are compiled once per session and staged like a real package (so the SONAME
links verify loads are made by the stage stage). Their behaviour comes from FAKE_* env vars.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from native import build_standins, packages
from native.contexts import make_ctx, node_args
from native.packages import tree_package

from installer.cli import cli
from installer.packages.manifest import Package
from installer.stages import stage, verify
from installer.stages.verify import nvml
from installer.testing import SAMPLE_NODES, NodeSpec, PciSpec, build_node

VERSION = "535.261.03"
INSTALL = "home/kubernetes/bin/nvidia"


@pytest.fixture(autouse=True)
def _fake_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test states its own stand-in behaviour."""
    for name in ("FAKE_NVML_INIT_ERROR", "FAKE_NVML_INIT_FAILURES", "FAKE_NVML_GPUS",
                 "FAKE_NVML_DRIVER",
                 "FAKE_NVML_DEVICE_ERROR", "FAKE_NVML_BUS_IDS", "FAKE_CUDA_INIT_ERROR",
                 "FAKE_CUDA_DEVICES", "FAKE_CUDA_WRONG", "FAKE_NVML_PENDING_PAGES",
                 "FAKE_NVML_FABRIC_STATE"):
        monkeypatch.delenv(name, raising=False)
    yield


TWO_GPUS = NodeSpec(os="debian-12", kernel="6.1.0-26-cloud-amd64",
                    pci=(PciSpec("0000:00:04.0", 0x27B8, 0x030200),
                         PciSpec("0000:00:05.0", 0x27B8, 0x030200)))
NODES = {1: SAMPLE_NODES["debian12-l4"], 2: TWO_GPUS, 8: SAMPLE_NODES["gke-cos-a100x8"],
         80: SAMPLE_NODES["rocky9-h100x8"]}


def staged_node(tmp_path: Path, package: Package, gpus: int) -> Path:
    root = build_node(tmp_path / f"node{gpus}", NODES[gpus])  # 80: 8 GPUs + NVSwitches
    stage.stage_package(make_ctx(root), package)
    return root


def gpu_env(monkeypatch: pytest.MonkeyPatch, root: Path, gpus: int) -> None:
    """Stand-in GPUs at the node's PCI addresses (as NVML prints them)."""
    addresses = sorted(p.name for p in (root / "sys/bus/pci/devices").iterdir()
                       if (p / "class").read_text().startswith("0x0302"))
    monkeypatch.setenv("FAKE_NVML_GPUS", str(gpus))
    monkeypatch.setenv("FAKE_CUDA_DEVICES", str(gpus))
    monkeypatch.setenv("FAKE_NVML_BUS_IDS", ",".join(f"0000{a.upper()}" for a in addresses))


def invoke(root: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, *node_args(root), "--log-format", "json",
                                    "--termination-log", str(root / "termination-log")])


class TestVerifyPasses:
    @pytest.mark.parametrize("gpus", [1, 2, 8])
    def test_all_gpus_seen_through_nvml_and_cuda(
            self, tmp_path: Path, standin_package: Package, monkeypatch: pytest.MonkeyPatch,
            gpus: int) -> None:
        root = staged_node(tmp_path, standin_package, gpus)
        gpu_env(monkeypatch, root, gpus)
        done = invoke(root, "verify", "--output", "json")
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout)
        assert report["driver_version"] == VERSION
        assert report["cuda_version"] == "12.2"
        assert len(report["gpus"]) == gpus == report["cuda"]["device_count"]
        assert len({g["uuid"] for g in report["gpus"]}) == gpus
        assert report["gpus"][0]["ecc_enabled"] is True
        nvswitch_node = gpus == 8  # the A100 x8 sample has six NVSwitches
        assert report["gpus"][0]["fabric_state"] == ("completed" if nvswitch_node else None)
        assert report["lib_dir"].endswith("/home/kubernetes/bin/nvidia/lib64")

    def test_cuda_smoke_runs_the_vector_add_on_every_gpu(
            self, tmp_path: Path, standin_package: Package,
            monkeypatch: pytest.MonkeyPatch) -> None:
        root = staged_node(tmp_path, standin_package, 2)
        gpu_env(monkeypatch, root, 2)
        done = invoke(root, "verify", "--cuda-smoke")
        assert done.exit_code == 0, done.output
        assert done.stdout.count("CUDA smoke ok") == 2

    def test_lib_dir_checks_libraries_outside_any_install_dir(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        root = build_node(tmp_path / "node", NODES[1])
        libs = build_standins(tmp_path / "libs")
        gpu_env(monkeypatch, root, 1)
        done = invoke(root, "verify", "--lib-dir", str(libs), "--cuda-smoke")
        assert done.exit_code == 0, done.output
        assert "CUDA smoke ok: GPU 0" in done.stdout

    def test_expected_count_overrides_pci(self, tmp_path: Path, standin_package: Package,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
        root = staged_node(tmp_path, standin_package, 8)
        gpu_env(monkeypatch, root, 8)
        monkeypatch.setenv("FAKE_NVML_GPUS", "1")
        monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
        assert invoke(root, "verify", "--expect-gpus", "1").exit_code == 0
        done = invoke(root, "verify", "--expect-gpus", "2")
        assert "NVML sees 1 GPU(s) but 2 were expected" in done.stderr

    def test_init_is_retried_right_after_a_module_load(
            self, tmp_path: Path, standin_package: Package,
            monkeypatch: pytest.MonkeyPatch) -> None:
        root = staged_node(tmp_path, standin_package, 1)
        gpu_env(monkeypatch, root, 1)
        failures = tmp_path / "failures"
        failures.write_text("3\n")
        monkeypatch.setenv("FAKE_NVML_INIT_FAILURES", str(failures))
        ctx = make_ctx(root)
        ctx.modules_loaded = True
        assert verify.run(ctx).driver_version == VERSION
        assert failures.read_text().strip() == "0"
        failures.write_text("1\n")
        with pytest.raises(nvml.KernelModuleNotLoadedError):
            verify.run(make_ctx(root))  # no load in this run: no retry

    def test_nvswitch_fabric_not_ready_is_a_warning(
            self, tmp_path: Path, standin_package: Package,
            monkeypatch: pytest.MonkeyPatch) -> None:
        root = staged_node(tmp_path, standin_package, 80)
        gpu_env(monkeypatch, root, 8)
        monkeypatch.setenv("FAKE_NVML_FABRIC_STATE", "1")
        done = invoke(root, "verify", "--output", "json")
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout)
        assert {g["fabric_state"] for g in report["gpus"]} == {"not-started"}
        assert "GPU 0 fabric state is not-started: is Fabric Manager running?" in \
            report["warnings"]

    def test_pending_page_retirement_is_a_warning(
            self, tmp_path: Path, standin_package: Package,
            monkeypatch: pytest.MonkeyPatch) -> None:
        root = staged_node(tmp_path, standin_package, 1)
        gpu_env(monkeypatch, root, 1)
        monkeypatch.setenv("FAKE_NVML_PENDING_PAGES", "1")
        done = invoke(root, "verify")
        assert done.exit_code == 0, done.output
        assert "pending retirement" in done.stdout


class TestVerifyFails:
    """Each failure: exit 12, one line naming the problem, readiness withdrawn."""

    def fail(self, root: Path, *args: str) -> str:
        ready = root / INSTALL / ".ready.json"
        env_file = root / "run/nvidia/validations/driver-ready"
        for path in (ready, env_file):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
        done = invoke(root, "verify", *args)
        assert done.exit_code == 12, done.output
        assert not ready.exists() and not env_file.exists()
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith("error(verification-failed): [verify] ")
        assert (root / "termination-log").read_text().strip() == line
        return line

    @pytest.mark.parametrize(("gpus", "fault", "args", "words"), [
        pytest.param(8, ("FAKE_NVML_GPUS", "7"), (),
                     "NVML sees 7 GPU(s) but 8 are on the PCI bus; not seen: 0000:cb:00.0",
                     id="gpu count differs from pci"),
        pytest.param(1, ("FAKE_NVML_DRIVER", "535.309.01"), (),
                     f"NVML reports driver 535.309.01, but {VERSION} was staged",
                     id="wrong driver version"),
        pytest.param(8, ("FAKE_NVML_DEVICE_ERROR", "1:15"), (),
                     "GPU fell off the bus: GPU index 1, PCI 0000:0b:00.0 by bus order",
                     id="error 15 gpu fell off the bus"),
        pytest.param(1, ("FAKE_CUDA_INIT_ERROR", "100"), (),
                     "CUDA cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA device visible",
                     id="cuda init error 100 says what it means"),
        pytest.param(1, ("FAKE_CUDA_INIT_ERROR", "999"), (),
                     "CUDA cuInit failed: CUDA_ERROR_UNKNOWN (999): unknown error",
                     id="cuda init error 999 says what it means"),
        pytest.param(2, ("FAKE_CUDA_WRONG", "1"), ("--cuda-smoke",),
                     "GPU 0 computed a wrong vector sum at 1 of 4096 elements (first at 7)",
                     id="wrong vector sum fails the smoke"),
    ])
    def test_a_fault_of_the_seen_gpus_is_named(
            self, tmp_path: Path, standin_package: Package, monkeypatch: pytest.MonkeyPatch,
            gpus: int, fault: tuple[str, str], args: tuple[str, ...], words: str) -> None:
        """The stand-ins see the node's GPUs, but with one fault (env var, value)."""
        root = staged_node(tmp_path, standin_package, gpus)
        gpu_env(monkeypatch, root, gpus)
        monkeypatch.setenv(*fault)
        assert words in self.fail(root, *args)

    def test_error_9_kernel_module_not_loaded(self, tmp_path: Path, standin_package: Package,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
        root = staged_node(tmp_path, standin_package, 1)
        monkeypatch.setenv("FAKE_NVML_INIT_ERROR", "9")
        line = self.fail(root)
        assert "NVIDIA kernel module not loaded (nvmlInit, NVML error 9)" in line

    def test_error_12_library_not_found(self, tmp_path: Path, standin_package: Package
                                        ) -> None:
        root = staged_node(tmp_path, standin_package, 1)
        (root / INSTALL / "lib64" / "libnvidia-ml.so.1").unlink()
        line = self.fail(root)
        assert f"NVML library not found at {root / INSTALL / 'lib64/libnvidia-ml.so.1'}" in line

    def test_error_18_names_both_versions(self, tmp_path: Path, standin_package: Package,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
        root = staged_node(tmp_path, standin_package, 1)
        nvrm = root / "proc/driver/nvidia/version"
        nvrm.parent.mkdir(parents=True)
        nvrm.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.309.01  "
                        "Thu Jun 26 2025\nGCC version:  gcc version 12.2.0\n")
        monkeypatch.setenv("FAKE_NVML_INIT_ERROR", "18")
        line = self.fail(root)
        assert (f"user-mode driver {VERSION} and kernel module 535.309.01 versions differ"
                in line)

    def test_error_13_function_not_found(self, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
        built = build_standins(tmp_path / "old", omit_driver_version=True)
        tree = packages.standin_tree(tmp_path / "tree", built, VERSION)
        root = staged_node(tmp_path, tree_package(tree, VERSION), 1)
        line = self.fail(root)
        assert "has no NVML function nvmlSystemGetDriverVersion" in line

    def test_nothing_staged(self, make_node: Callable[[str], Path]) -> None:
        line = self.fail(make_node("debian12-l4"))
        assert "nothing is staged in /home/kubernetes/bin/nvidia" in line
