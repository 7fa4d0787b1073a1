"""The installer's MIG table against an independent oracle: the NVML stand-in's own model
file (tests/native/nvml_standin_mig_models.c, transcribed from NVIDIA's MIG User Guide,
mig-parted's config-default.yaml and GKE's partition list), asked through the real pynvml
as the installer asks a driver. Any difference in a model's sizes, NVML constants, slices,
counts, memory or placements fails, and so does a model one side has and the other lacks.
The memory is compared as a name gives it: NVML's memorySizeMB turned into GB by go-nvlib's
rule (`installer.compat.mignvml.memory_gb`), and the installer's own reading of the
stand-in's answer (`nvml.discover`, what it plans from) must equal the table's model.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from native.nvmlsession import nvml_session

from installer.compat.mig import MODELS, MigModel, mig_model
from installer.compat.mignvml import differences, memory_gb
from installer.stages.partition import nvml

MIB = 1 << 20

# One NVML name and memory per part: every name a model of the table answers to.
GPUS = [
    ("NVIDIA A100-SXM4-40GB", 40536), ("NVIDIA A100-SXM4-80GB", 81920),
    ("NVIDIA A800-SXM4-40GB", 40536), ("NVIDIA A800-SXM4-80GB", 81920),
    ("NVIDIA A30", 24169),
    ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA H100 NVL", 95830),
    ("NVIDIA H100 96GB HBM3", 97871), ("NVIDIA H800", 81559), ("NVIDIA H800 NVL", 95830),
    ("NVIDIA H20", 97871), ("NVIDIA GH200 480GB", 97871), ("NVIDIA GH200 144G HBM3e", 147000),
    ("NVIDIA PG506-96GB", 97871),
    ("NVIDIA H200", 143771), ("NVIDIA H200 NVL", 143771), ("NVIDIA B200", 183359),
    ("NVIDIA GB200", 189471), ("NVIDIA B300 SXM6 AC", 275040), ("NVIDIA GB300", 284000),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887),
]
# (GH200 144G, B300, GB300: figures whose whole GiB is the 7g size's GB, as go-nvlib's
# naming needs of a real board; not read off one. A30, RTX PRO 6000: nominal too, not
# checked against a board here)
NO_MIG = [("Tesla T4", 15360), ("NVIDIA L4", 23034), ("NVIDIA L40S", 46068),
          ("NVIDIA RTX 6000 Ada Generation", 49140), ("NVIDIA A10G", 23028)]

# What one size is, on either side: (NVML constant, compute slices, how many, memory GB,
# memory slots, placement starts).
Row = tuple[int, int, int, int, int, tuple[int, ...]]


@pytest.fixture
def one_gpu(tmp_path: Path, fake_env: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    fake_env.setenv("FAKE_NVML_MIG_DIR", str(tmp_path / "mig"))
    fake_env.setenv("FAKE_NVML_GPUS", "1")
    yield fake_env


def _standin(libs: Path, env: pytest.MonkeyPatch, name: str, memory: int,
             state: Path) -> dict[str, Row] | None:
    """The stand-in's answer for one GPU, MIG on: each GI profile it offers; None: no MIG."""
    env.setenv("FAKE_NVML_NAME", name)
    env.setenv("FAKE_NVML_MEMORY_MIB", str(memory))
    for old in state.glob("*") if state.exists() else []:
        old.unlink()
    with nvml_session(libs):
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        try:
            pynvml.nvmlDeviceSetMigMode(handle, 1)
        except pynvml.NVMLError as exc:
            assert exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED
            return None
        if pynvml.nvmlDeviceGetMigMode(handle)[0] != 1:  # Ampere: the mode waits for a reset
            (state / "reset-gpu0").touch()
        found: dict[str, Row] = {}
        for constant in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
            except pynvml.NVMLError as exc:
                assert exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            array = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
            count = ctypes.c_uint(8)
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, array,
                                                              ctypes.byref(count))
            places = [array[i] for i in range(count.value)]
            label = info.name.decode() if isinstance(info.name, bytes) else info.name
            found[label.removeprefix("MIG ")] = (
                constant, info.sliceCount, info.instanceCount,
                memory_gb(memory * MIB, info.memorySizeMB),
                places[0].size, tuple(p.start for p in places))
    return found


def _table(model: MigModel) -> dict[str, Row]:
    return {name: (p.gi_profile, p.slices, p.max_count, int(p.memory_gib), p.size,
                   p.placements) for name, p in model.profiles.items()}


@pytest.mark.parametrize(("name", "memory"), GPUS, ids=[g[0] for g in GPUS])
def test_the_table_and_the_standin_agree_on_every_size(
        libs: Path, one_gpu: pytest.MonkeyPatch, tmp_path: Path, name: str,
        memory: int) -> None:
    model = mig_model(name, memory)
    assert model is not None, f"the table has no MIG model for {name}"
    standin = _standin(libs, one_gpu, name, memory, tmp_path / "mig")
    assert standin is not None, f"the stand-in has no MIG for {name}"
    assert _table(model) == standin


@pytest.mark.parametrize(("name", "memory"), GPUS, ids=[g[0] for g in GPUS])
def test_planned_from_the_standins_nvml_answer_is_the_tables_model(
        libs: Path, one_gpu: pytest.MonkeyPatch, tmp_path: Path, name: str,
        memory: int) -> None:
    """What the installer plans from where NVML answers (`nvml.discover`) is the table's
    model for every part: same names, counts, slices and placements (A30: the table, as
    mig-parted, since NVML misreports its counts)."""
    model = mig_model(name, memory)
    assert model is not None
    assert _standin(libs, one_gpu, name, memory, tmp_path / "mig") is not None  # MIG on
    with nvml_session(libs):
        found = nvml.discover(pynvml.nvmlDeviceGetHandleByIndex(0), name, memory * MIB)
    if model.name.startswith("A30"):
        assert found is None
        return
    assert found is not None
    assert differences(found, model) == []
    assert (found.name, found.slots, found.compute_slices) == (
        model.name, model.slots, model.compute_slices)


@pytest.mark.parametrize(("name", "memory"), NO_MIG, ids=[g[0] for g in NO_MIG])
def test_neither_gives_mig_to_a_gpu_without_it(libs: Path, one_gpu: pytest.MonkeyPatch,
                                               tmp_path: Path, name: str,
                                               memory: int) -> None:
    assert mig_model(name, memory) is None
    assert _standin(libs, one_gpu, name, memory, tmp_path / "mig") is None


def test_every_model_of_the_table_is_compared() -> None:
    """A model added to the table without a GPU here would go unchecked."""
    compared = {model.name for name, memory in GPUS
                if (model := mig_model(name, memory)) is not None}
    assert compared == {model.name for _, _, model in MODELS}


def test_the_comparison_fails_on_a_difference(libs: Path, one_gpu: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """The oracle can fail: GB200's pre-production table (1g.24gb, 3g.95gb, ...) differs."""
    standin = _standin(libs, one_gpu, "NVIDIA GB200", 189471, tmp_path / "mig")
    assert standin is not None and "1g.23gb" in standin and "1g.24gb" not in standin
    old = {("1g.24gb" if k == "1g.23gb" else k): v for k, v in standin.items()}
    model = mig_model("NVIDIA GB200", 189471)
    assert model is not None and _table(model) != old
