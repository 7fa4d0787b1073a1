"""NVIDIA's default mig-parted configs on every MIG model of the table, and GKE's
gpu_config.json for every size GKE lists per model, on the NVML stand-in:
each of config-default.yaml's configs (tests/migconfigs.py `DEFAULTS`, its file at
bd7160f4) applied in turn to one GPU of each model, through the stage's own steps (read,
layouts, validate, apply), with the outcome mig-parted would give.

The expected outcome comes from the GPU's own answer, as mig-parted generates its configs
since its commits 6ef7bf0e and 219e780d: the entry that reaches the GPU (device filter;
none: the GPU is left alone) is refused when it names a size the stand-in's NVML does not
offer for the GPU or more of one than `instanceCount`, else the GPU ends with that layout.
"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from migconfigs import GKE, MODEL_GPUS, default_configs, default_entries
from native.nvmlsession import nvml_session

from installer.errors import MigConfigError, MigLayoutError
from installer.stages.partition import config, nvml
from installer.stages.partition.plan import GpuLayout, changes, layout, validate

CONFIGS = default_entries()
TEXT = default_configs()


def _offered() -> dict[str, int]:
    """The sizes NVML offers GPU 0 (MIG on), with how many fit: the GPU's own answer."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    found = {}
    for constant in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
        except pynvml.NVMLError:
            continue
        name = info.name.decode() if isinstance(info.name, bytes) else info.name
        found[name.removeprefix("MIG ")] = int(info.instanceCount)
    return found


def _expected(name: str, pci: str, offered: dict[str, int]) -> GpuLayout | bool | None:
    """What mig-parted does with config `name` on this GPU: the layout it reaches, None
    when no entry reaches the GPU, False when it fails."""
    reaching = [counts for ids, counts in CONFIGS[name] if not ids or pci in ids]
    if not reaching:
        return None
    counts = reaching[-1]
    if counts is None:
        return GpuLayout(False, ())
    if any(offered.get(size, 0) < count for size, count in counts.items()):
        return False
    return layout(True, counts)


def _apply(state: Path, want: dict[int, GpuLayout]) -> None:
    """The stage's apply, a GPU reset given where the mode waits for one (Ampere)."""
    gpus = nvml.read_gpus()
    for change in changes(want, gpus):
        if nvml.apply(change):
            (state / "reset-gpu0").touch()
            for again in changes(want, nvml.read_gpus()):
                assert not nvml.apply(again)


def _one_gpu(env: pytest.MonkeyPatch, state: Path, model: str) -> None:
    gpu_name, memory, _ = MODEL_GPUS[model]
    state.mkdir()
    for key, value in {"FAKE_NVML_MIG_DIR": str(state), "FAKE_NVML_GPUS": "1",
                       "FAKE_NVML_NAME": gpu_name, "FAKE_NVML_MEMORY_MIB": str(memory)}.items():
        env.setenv(key, value)


@pytest.mark.parametrize("model", GKE)
def test_gkes_partition_sizes_on_each_model(libs: Path, fake_env: pytest.MonkeyPatch,
                                            tmp_path: Path, model: str) -> None:
    """GKE's `{"GPUPartitionSize": size}` (partition_gpu.go @ 992db812): as many of the size
    as GKE's `partitionSizeMaxCount` says fit, each size in turn on the same GPU."""
    state = tmp_path / "mig"
    _one_gpu(fake_env, state, model)
    with nvml_session(libs):
        for [(size, count)] in (list(layout.items()) for layout in GKE[model]):
            source = config.gke_source(f'{{"GPUPartitionSize": "{size}"}}', "gpu_config.json")
            assert source is not None
            before = nvml.read_gpus()
            want = source.layouts(before, lambda gpu: None)
            validate(want, before)
            _apply(state, want)
            assert nvml.read_gpus()[0].layout == layout(True, {size: count}), size


@pytest.mark.parametrize("model", MODEL_GPUS)
def test_every_default_config_on_each_model(libs: Path, fake_env: pytest.MonkeyPatch,
                                            tmp_path: Path, model: str) -> None:
    gpu_name, _, device = MODEL_GPUS[model]
    pci = f"0x{device}10DE"
    state = tmp_path / "mig"
    _one_gpu(fake_env, state, model)
    outcomes: dict[str, str] = {}
    with nvml_session(libs):
        _apply(state, {0: GpuLayout(True, ())})
        offered = _offered()
        assert offered, f"the stand-in offers no MIG size for {gpu_name}"
        for name in CONFIGS:
            expected = _expected(name, pci, offered)
            source = config.mig_parted_source(TEXT, "config-default.yaml", name)
            before = nvml.read_gpus()
            want = source.layouts(before, lambda gpu: pci)
            try:
                validate(want, before)
            except (MigConfigError, MigLayoutError) as exc:
                assert expected is False, f"{name}: refused: {exc.one_line()}"
                assert nvml.read_gpus() == before, f"{name}: refused but changed the GPU"
                outcomes[name] = "refused"
                continue
            assert expected is not False, f"{name}: accepted {want}, mig-parted fails"
            if expected is None:
                assert want == {}, name
                outcomes[name] = "untouched"
                continue
            _apply(state, want)
            assert nvml.read_gpus()[0].layout == expected, name
            outcomes[name] = "applied"
    applied = [name for name, outcome in outcomes.items() if outcome == "applied"]
    # all-disabled, all-enabled, one config per size the model offers, all-balanced
    assert len(applied) == 3 + len(offered), applied
    assert "all-balanced" in applied and len(outcomes) == len(CONFIGS)
