"""NVIDIA's default mig-parted configs on every MIG model of the table, and GKE's
gpu_config.json for every size GKE lists per model, on the NVML stand-in:
each of config-default.yaml's configs (tests/migconfigs.py `DEFAULTS`, its file at
bd7160f4) applied in turn to one GPU of each model, through the stage's own steps (read,
layouts, validate, apply), with the outcome mig-parted would give.

The expected outcome comes from the GPU's own answer, as mig-parted generates its configs
since its commits 6ef7bf0e and 219e780d: the entry that reaches the GPU (device filter;
none: the GPU is left alone) is refused when it names a size the stand-in's NVML does not
offer for the GPU or more of one than `instanceCount`, else the GPU ends with that layout.

The issue speaks of "NVIDIA's 13 default configs"; no version of config-default.yaml has
13 (17 in 2023, 81 since 2025-10), so all 81 are applied to every model, and how many of
them apply per model (`APPLIED`) and the issue's own cases by name (`NAMED`) are written
here by hand from the file, not derived from the stand-in.
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

# The configs that apply per model, counted from config-default.yaml @ bd7160f4:
# all-disabled, all-enabled, all-balanced and the `all-<size>` of each size the model has
# (7 on a 7-slice part, 5 on the A30, 11 on the RTX PRO 6000); every other config is
# refused (a size the GPU lacks) or leaves the GPU alone (a device filter for others).
APPLIED = {model: 10 for model in MODEL_GPUS} | {"A30-24GB": 8, "RTX-PRO-6000": 14}
_RTX = ("1g.24gb", "1g.24gb.me", "1g.24gb.gfx", "1g.24gb-me", "1g.24gb.me.all", "2g.48gb",
        "2g.48gb.gfx", "2g.48gb-me", "2g.48gb.me.all", "4g.96gb", "4g.96gb.gfx")
# The broken models by name: (configs that must apply, configs that must be
# refused). GB200's production sizes apply and those mig-parted's ebab1f77 replaced
# (1g.24gb, 3g.95gb, 4g.95gb, 7g.189gb) are refused; each GH200 takes its own sizes and
# not its neighbour's; the RTX PRO 6000 takes every variant.
NAMED: dict[str, tuple[set[str], set[str]]] = {
    "GB200": ({"all-1g.23gb", "all-1g.23gb.me", "all-1g.47gb", "all-2g.47gb", "all-3g.93gb",
               "all-4g.93gb", "all-7g.186gb", "all-balanced"},
              {"all-1g.24gb", "all-3g.95gb", "all-4g.95gb", "all-7g.189gb"}),
    "GH200-96GB": ({"all-1g.12gb", "all-1g.12gb.me", "all-1g.24gb", "all-2g.24gb",
                    "all-3g.48gb", "all-4g.48gb", "all-7g.96gb", "all-balanced"},
                   {"all-3g.47gb", "all-7g.94gb", "all-7g.144gb"}),
    "GH200-144GB": ({"all-1g.18gb", "all-1g.18gb.me", "all-1g.36gb", "all-2g.36gb",
                     "all-3g.72gb", "all-4g.72gb", "all-7g.144gb", "all-balanced"},
                    {"all-3g.71gb", "all-7g.141gb", "all-7g.96gb"}),
    "RTX-PRO-6000": ({f"all-{size}" for size in _RTX} | {"all-balanced"},
                     {"all-1g.5gb", "all-7g.40gb"}),
}


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
    assert len(applied) == 3 + len(offered) == APPLIED[model], applied
    assert "all-balanced" in applied and len(outcomes) == len(CONFIGS) == 81
    must_apply, must_refuse = NAMED.get(model, (set(), set()))
    assert {name: outcomes[name] for name in must_apply | must_refuse} == {
        **{name: "applied" for name in must_apply},
        **{name: "refused" for name in must_refuse}}
