"""MIG through the real pynvml over the compiled NVML stand-in (tests/native/nvml_standin_mig.c):
read, partition, re-read idempotent, A100's pending reset, a changed layout re-partitioning
only the GPU that differs, impossible layouts and held GPUs refused with nothing changed, and
the capability files a driver publishes for each instance.

The stand-in keeps each GPU's MIG state in FAKE_NVML_MIG_DIR (so another process, a rerun,
sees it), publishes the capability files under FAKE_NVML_PROC_DIR, and takes a file
"reset-gpu<i>" in the state directory as a GPU reset.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from native.nvmlsession import nvml_session

from installer.errors import MigInUseError, MigLayoutError
from installer.stages.partition import nvml
from installer.stages.partition.plan import GpuChange, GpuLayout, changes, layout, validate

A100_40 = ("NVIDIA A100-SXM4-40GB", 40536)
A100_80 = ("NVIDIA A100-SXM4-80GB", 81920)
H100 = ("NVIDIA H100 80GB HBM3", 81559)
H100_NVL = ("NVIDIA H100 NVL", 95830)
H200 = ("NVIDIA H200", 143771)
B200 = ("NVIDIA B200", 183359)
GB200 = ("NVIDIA GB200", 189471)
GH200_96 = ("NVIDIA GH200 480GB", 97871)
GH200_144 = ("NVIDIA GH200 144G HBM3e", 147000)  # whole GiB: 144
A30 = ("NVIDIA A30", 24169)
RTX_PRO = ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)
OFF = GpuLayout(False, ())

RERUN = """
import json, sys
from pathlib import Path
import pynvml
from installer.stages.verify.nvml import bind_library
from installer.stages.partition import nvml, plan
bind_library(Path(sys.argv[1]))
pynvml.nvmlInit()
gpus = nvml.read_gpus()
want = {g.index: plan.layout(True, json.loads(sys.argv[2])) for g in gpus}
plan.validate(want, gpus)
found = plan.changes(want, gpus)
resets = [nvml.apply(change) for change in found]
print(json.dumps({"changed": [c.gpu.index for c in found], "resets": resets}))
pynvml.nvmlShutdown()
"""


class Node:
    """The test's view of the stand-in's node: state and /proc directories."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state, self.proc = root / "mig", root / "proc"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("FAKE_NVML_MIG_DIR", str(self.state))
        monkeypatch.setenv("FAKE_NVML_PROC_DIR", str(self.proc))

    def gpus(self, count: int, model: tuple[str, int]) -> None:
        self.monkeypatch.setenv("FAKE_NVML_GPUS", str(count))
        self.monkeypatch.setenv("FAKE_NVML_NAME", model[0])
        self.monkeypatch.setenv("FAKE_NVML_MEMORY_MIB", str(model[1]))

    def reset(self, *indexes: int) -> None:
        self.state.mkdir(exist_ok=True)
        for index in indexes:
            (self.state / f"reset-gpu{index}").touch()

    def snapshot(self) -> dict[str, tuple[int, bytes]]:
        """Every state and capability file: its mtime and bytes."""
        return {str(p.relative_to(self.state.parent)):
                (p.stat().st_mtime_ns, p.read_bytes())
                for base in (self.state, self.proc) if base.exists()
                for p in sorted(base.rglob("*")) if p.is_file() and p.name != "lock"}

    def caps(self, gpu: int) -> dict[str, int]:
        """The GPU's per-instance capability files: relative path -> DeviceFileMinor."""
        base = self.proc / f"driver/nvidia/capabilities/gpu{gpu}/mig"
        found = {}
        for path in sorted(base.rglob("access")) if base.exists() else []:
            lines = dict(line.split(": ") for line in path.read_text().splitlines())
            assert lines["DeviceFileMode"] == "292" and lines["DeviceFileModify"] == "1"
            found[str(path.parent.relative_to(base))] = int(lines["DeviceFileMinor"])
        return found


@pytest.fixture
def node(tmp_path: Path, fake_env: pytest.MonkeyPatch) -> Iterator[Node]:
    yield Node(tmp_path, fake_env)


def on(devices: dict[str, int]) -> GpuLayout:
    return layout(True, devices)


def partition(want: dict[int, GpuLayout]) -> tuple[list[int], list[bool]]:
    """One partition pass as the stage does it: read, validate, apply what differs."""
    gpus = nvml.read_gpus()
    validate(want, gpus)
    found = changes(want, gpus)
    return [c.gpu.index for c in found], [nvml.apply(c) for c in found]


def rerun(libs: Path, devices: dict[str, int]) -> dict[str, list[object]]:
    """The same pass in a new process on every GPU, as the next installer run does it."""
    done = subprocess.run([sys.executable, "-c", RERUN, str(libs / "libnvidia-ml.so.1"),
                           json.dumps(devices)], check=True, capture_output=True, text=True)
    result: dict[str, list[object]] = json.loads(done.stdout)
    return result


class TestRead:
    def test_a_fresh_node_reads_mig_off_and_the_driver_tables_appear(
            self, libs: Path, node: Node) -> None:
        node.gpus(8, A100_40)
        with nvml_session(libs):
            gpus = nvml.read_gpus()
        assert [g.index for g in gpus] == list(range(8))
        assert all(g.layout == OFF and not g.mode_pending for g in gpus)
        assert gpus[3].name == A100_40[0] and gpus[3].memory_mib == A100_40[1]
        assert gpus[3].pci_bus_id == "00000000:13:00.0" and gpus[3].uuid.startswith("GPU-")
        minors = (node.proc / "driver/nvidia-caps/mig-minors").read_text().splitlines()
        assert minors[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3",
                              "gpu0/gi0/ci0/access 4"]
        assert minors[-1] == "gpu31/gi14/ci7/access 4322" and len(minors) == 2 + 32 * 15 * 9
        assert node.caps(0) == {}

    def test_a_gpu_without_mig_reads_as_mig_off(self, libs: Path, node: Node) -> None:
        node.gpus(2, ("Tesla T4", 15360))
        with nvml_session(libs):
            gpus = nvml.read_gpus()
        assert [g.layout for g in gpus] == [OFF, OFF]
        assert not any(g.mode_pending for g in gpus)


class TestA100PendingReset:
    def test_gke_seven_1g_on_eight_a100s_waits_for_a_reset_then_completes(
            self, libs: Path, node: Node) -> None:
        node.gpus(8, A100_40)
        want = {i: on({"1g.5gb": 7}) for i in range(8)}
        with nvml_session(libs):
            changed, resets = partition(want)
            pending = nvml.read_gpus()
        assert changed == list(range(8)) and resets == [True] * 8
        assert all(g.mode_pending and g.layout == OFF for g in pending)
        assert node.caps(0) == {}
        # the same pass again before the reset: still pending, nothing else done
        with nvml_session(libs):
            assert partition(want) == (list(range(8)), [True] * 8)
        node.reset(*range(8))
        with nvml_session(libs):
            changed, resets = partition(want)
            done = nvml.read_gpus()
        assert changed == list(range(8)) and resets == [False] * 8
        assert all(g.layout == on({"1g.5gb": 7}) and not g.mode_pending for g in done)
        assert node.caps(5) == {**{f"gi{i}": 3 + 135 * 5 + 9 * i for i in range(7, 14)},
                                **{f"gi{i}/ci0": 4 + 135 * 5 + 9 * i for i in range(7, 14)}}

    def test_a_rerun_in_another_process_changes_nothing(self, libs: Path, node: Node) -> None:
        node.gpus(2, A100_40)
        assert rerun(libs, {"1g.5gb": 7}) == {"changed": [0, 1], "resets": [True, True]}
        node.reset(0, 1)
        assert rerun(libs, {"1g.5gb": 7}) == {"changed": [0, 1], "resets": [False, False]}
        before = node.snapshot()
        assert rerun(libs, {"1g.5gb": 7}) == {"changed": [], "resets": []}
        assert node.snapshot() == before

    def test_mig_off_on_an_a100_is_pending_too(self, libs: Path, node: Node) -> None:
        node.gpus(1, A100_80)
        node.reset(0)
        with nvml_session(libs):
            partition({0: on({"3g.40gb": 2})})  # mode pending: nothing made yet
        node.reset(0)
        with nvml_session(libs):
            assert partition({0: on({"3g.40gb": 2})}) == ([0], [False])
            assert partition({0: OFF}) == ([0], [True])
            gpu = nvml.read_gpus()[0]
        assert gpu.layout == on({}) and gpu.mode_pending
        assert node.caps(0) == {}

    def test_a_reset_drops_the_instances_and_the_next_pass_remakes_them(
            self, libs: Path, node: Node) -> None:
        node.gpus(1, A100_40)
        want = {0: on({"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})}
        with nvml_session(libs):
            partition(want)
        node.reset(0)
        with nvml_session(libs):
            assert partition(want) == ([0], [False])
        node.reset(0)  # a reboot
        with nvml_session(libs):
            assert nvml.read_gpus()[0].layout == on({})
            assert partition(want) == ([0], [False])
            assert nvml.read_gpus()[0].layout == want[0]


class TestPartition:
    def test_h100_seven_1g_10gb_at_once_with_its_capability_files(
            self, libs: Path, node: Node) -> None:
        node.gpus(2, H100)
        with nvml_session(libs):
            assert partition({0: on({"1g.10gb": 7}), 1: OFF}) == ([0], [False])
            gpus = nvml.read_gpus()
            assert partition({0: on({"1g.10gb": 7}), 1: OFF}) == ([], [])
        assert gpus[0].layout == on({"1g.10gb": 7}) and not gpus[0].mode_pending
        assert gpus[1].layout == OFF
        assert sorted(node.caps(0).values()) == sorted(
            [3 + 9 * i for i in range(7, 14)] + [4 + 9 * i for i in range(7, 14)])
        assert node.caps(1) == {}

    @pytest.mark.parametrize(("model", "balanced"), [
        (A100_80, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        (H100, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        (H100_NVL, {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}),
        (H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        (B200, {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}),
        (GB200, {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}),
        (GH200_96, {"1g.12gb": 2, "2g.24gb": 1, "3g.48gb": 1}),
        (GH200_144, {"1g.18gb": 2, "2g.36gb": 1, "3g.72gb": 1}),
        (A30, {"1g.6gb": 2, "2g.12gb": 1}),
        (RTX_PRO, {"1g.24gb": 2, "2g.48gb": 1}),
        (RTX_PRO, {"1g.24gb+gfx": 2, "2g.48gb-me": 1}),
    ], ids=["a100-80gb", "h100", "h100-nvl", "h200", "b200", "gb200", "gh200-96gb",
            "gh200-144gb", "a30", "rtx-pro-6000", "rtx-pro-6000-gfx"])
    def test_mig_parteds_all_balanced_on_each_model(self, libs: Path, node: Node,
                                                    model: tuple[str, int],
                                                    balanced: dict[str, int]) -> None:
        node.gpus(1, model)
        node.reset(0)  # an A100 takes the mode at this reset
        with nvml_session(libs):
            if partition({0: on(balanced)})[1] == [True]:
                node.reset(0)
                partition({0: on(balanced)})
            assert nvml.read_gpus()[0].layout == on(balanced)
            assert partition({0: on(balanced)}) == ([], [])

    def test_a_changed_layout_repartitions_only_the_gpu_that_differs(
            self, libs: Path, node: Node) -> None:
        node.gpus(3, H100)
        balanced = on({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
        with nvml_session(libs):
            partition({0: balanced, 1: balanced, 2: balanced})
        kept = node.caps(1)["gi2"]  # the 3g.40gb at slot 4 (gpu instance 2)
        kept_file = node.snapshot()["proc/driver/nvidia/capabilities/gpu1/mig/gi2/access"]
        untouched = {k: v for k, v in node.snapshot().items() if "gpu1" not in k}
        with nvml_session(libs):
            changed, _ = partition({0: balanced, 1: on({"3g.40gb": 2}), 2: balanced})
            gpus = nvml.read_gpus()
        assert changed == [1]
        assert [g.layout for g in gpus] == [balanced, on({"3g.40gb": 2}), balanced]
        assert {k: v for k, v in node.snapshot().items() if "gpu1" not in k} == untouched
        assert node.caps(1) == {"gi1": 3 + 135 + 9, "gi1/ci0": 4 + 135 + 9,
                                "gi2": kept, "gi2/ci0": kept + 1}
        # the instance already of a wanted size was kept, not destroyed and made again
        assert node.snapshot()["proc/driver/nvidia/capabilities/gpu1/mig/gi2/access"] == (
            kept_file)

    def test_mig_off_destroys_every_instance_first(self, libs: Path, node: Node) -> None:
        node.gpus(1, H200)
        with nvml_session(libs):
            partition({0: on({"1g.18gb": 3, "2g.35gb": 2})})
            assert partition({0: OFF}) == ([0], [False])
            assert nvml.read_gpus()[0].layout == OFF
        assert node.caps(0) == {}

    def test_an_instance_left_without_its_compute_instance_is_remade(
            self, libs: Path, node: Node) -> None:
        """A run killed between creating a GPU instance and its compute instance."""
        node.gpus(1, H100)
        with nvml_session(libs):
            partition({0: on({"1g.10gb": 1})})
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                handle, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
            pynvml.nvmlDeviceCreateGpuInstance(handle, info.id)
            assert nvml.read_gpus()[0].layout == on({"1g.10gb": 1,
                                                     "3g.40gb (incomplete)": 1})
            assert partition({0: on({"1g.10gb": 1, "3g.40gb": 1})}) == ([0], [False])
            assert nvml.read_gpus()[0].layout == on({"1g.10gb": 1, "3g.40gb": 1})


class TestRefusals:
    def test_an_impossible_layout_is_refused_with_nothing_changed(
            self, libs: Path, node: Node) -> None:
        node.gpus(2, H100)
        with nvml_session(libs):
            partition({0: on({"1g.10gb": 7}), 1: on({"7g.80gb": 1})})
        before = node.snapshot()
        with nvml_session(libs), pytest.raises(MigLayoutError) as caught:
            partition({0: on({"1g.10gb": 7}), 1: on({"3g.40gb": 2, "1g.10gb": 1})})
        assert caught.value.code == 14
        assert "GPU 1 (NVIDIA H100 80GB HBM3" in caught.value.one_line()
        assert node.snapshot() == before

    def test_apply_itself_refuses_a_layout_that_cannot_fit_before_destroying(
            self, libs: Path, node: Node) -> None:
        node.gpus(1, H100)
        with nvml_session(libs):
            partition({0: on({"2g.20gb": 3})})
            before = node.snapshot()
            gpu = nvml.read_gpus()[0]
            with pytest.raises(MigLayoutError):
                nvml.apply(GpuChange(gpu, on({"4g.40gb": 1, "2g.20gb": 2}), False))
            assert node.snapshot() == before

    def test_a_held_gpu_is_refused_with_exit_10_and_left_as_it_was(
            self, libs: Path, node: Node) -> None:
        node.gpus(2, H100)
        with nvml_session(libs):
            partition({0: on({"1g.10gb": 7}), 1: on({"1g.10gb": 7})})
        before = node.snapshot()
        node.monkeypatch.setenv("FAKE_NVML_MIG_BUSY", "1")
        with nvml_session(libs), pytest.raises(MigInUseError) as caught:
            partition({0: on({"1g.10gb": 7}), 1: on({"7g.80gb": 1})})
        assert caught.value.code == 10 and "GPU 1" in caught.value.one_line()
        assert node.snapshot() == before
