"""The MIG profile table (installer/compat/mig.py): sizes, ids and placements per model, and
that NVIDIA's own mig-parted configs (`all-1g.*`, `all-balanced`, ...) fit each model."""

from __future__ import annotations

import itertools
import re

import pytest
from migconfigs import GKE, layouts

from installer.compat import mig
from installer.compat.mig import MODELS, MigModel, mig_model

ALL = [pytest.param(model, id=model.name)
       for model in {model.name: model for _, _, model in MODELS}.values()]

# (NVML name, memory NVML reports in MiB, model). Memory as `nvidia-smi` shows it on each part.
REAL_GPUS = [
    ("NVIDIA A100-SXM4-40GB", 40536, "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
    ("NVIDIA H100 NVL", 95830, "H100-94GB"),
    ("NVIDIA H200", 143771, "H200-141GB"),
    ("NVIDIA H200 NVL", 143771, "H200-141GB"),
    ("NVIDIA B200", 183359, "B200"),
    ("NVIDIA GB200", 189471, "GB200"),
    # below: the nominal size less 1-2 %, as NVML reports it on the parts above (not measured)
    ("NVIDIA GH200 480GB", 97871, "GH200-96GB"),
    ("NVIDIA H20", 97871, "GH200-96GB"),
    ("NVIDIA GH200 144G HBM3e", 146000, "GH200-144GB"),
    ("NVIDIA A30", 24169, "A30-24GB"),
    ("NVIDIA B300 SXM6 AC", 270000, "B300"),
    ("NVIDIA GB300", 279000, "GB300"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "RTX-PRO-6000"),
]

# NVIDIA/mig-parted deployments/systemd/config-default.yaml @ bd7160f4: each model's
# `all-<size>` layouts (the model as the comment above each config, or its device filter,
# names it) and its `all-balanced` entry, last.
_SEVEN = ("1g.{0}gb:7 1g.{0}gb+me:1 1g.{1}gb:4 2g.{1}gb:3 3g.{2}gb:2 4g.{2}gb:1 7g.{3}gb:1 "
          "1g.{0}gb:2,2g.{1}gb:1,3g.{2}gb:1")


PARTED = {
    "A100-40GB": [*layouts(_SEVEN.format(5, 10, 20, 40)), {"1g.10gb": 4}],
    "A100-80GB": layouts(_SEVEN.format(10, 20, 40, 80)),
    "A30-24GB": layouts("1g.6gb:4 1g.6gb+me:1 2g.12gb:2 2g.12gb+me:1 4g.24gb:1 "
                         "1g.6gb:2,2g.12gb:1"),
    "H100-80GB": layouts(_SEVEN.format(10, 20, 40, 80)),
    "H100-94GB": layouts(_SEVEN.format(12, 24, 47, 94)),
    "GH200-96GB": layouts(_SEVEN.format(12, 24, 48, 96)),
    "GH200-144GB": layouts(_SEVEN.format(18, 36, 72, 144)),
    "H200-141GB": layouts(_SEVEN.format(18, 35, 71, 141)),
    "B200": layouts(_SEVEN.format(23, 45, 90, 180)),
    "GB200": layouts(_SEVEN.format(23, 47, 93, 186)),
    "B300": layouts(_SEVEN.format(34, 67, 135, 269)),
    "GB300": layouts(_SEVEN.format(35, 70, 139, 278)),
    "RTX-PRO-6000": layouts("1g.24gb:4 1g.24gb+gfx:4 1g.24gb+me.all:1 1g.24gb-me:4 2g.48gb:2 "
                             "2g.48gb+gfx:2 2g.48gb+me.all:1 2g.48gb-me:2 4g.96gb:1 "
                             "4g.96gb+gfx:1 1g.24gb:2,2g.48gb:1"),
}

def _by_name(name: str) -> MigModel:
    return next(model for _, _, model in MODELS if model.name == name)


def _slots(model: MigModel, placed: list[tuple[str, int]]) -> list[int]:
    """How many instances cover each of the GPU's memory slots."""
    cover = [0] * model.slots
    for name, start in placed:
        for slot in range(start, start + model.profiles[name].size):
            cover[slot] += 1
    return cover


def _label(layout: dict[str, int]) -> str:
    return "+".join(f"{count}x{name}" for name, count in layout.items())


class TestModels:
    @pytest.mark.parametrize(("name", "memory", "model"), REAL_GPUS)
    def test_an_nvml_name_and_memory_pick_the_model(self, name: str, memory: int,
                                                    model: str) -> None:
        found = mig_model(name, memory)
        assert found is not None and found.name == model

    @pytest.mark.parametrize("name", ["Tesla T4", "NVIDIA L4", "NVIDIA A10G", "NVIDIA L40S",
                                      "Tesla V100-SXM2-16GB", "NVIDIA RTX A6000",
                                      "NVIDIA RTX 6000 Ada Generation", "NVIDIA A40"])
    def test_gpus_without_mig_have_no_model(self, name: str) -> None:
        assert mig_model(name, 24576) is None

    def test_only_ampere_needs_a_reset_for_a_mode_change(self) -> None:
        assert {m.name for _, _, m in MODELS if m.needs_reset} == {"A100-40GB", "A100-80GB",
                                                                     "A30-24GB"}

    @pytest.mark.parametrize("model", ALL)
    def test_every_model_names_its_sources(self, model: MigModel) -> None:
        assert model.sources and all(model.sources)

    @pytest.mark.parametrize("model", ALL)
    def test_every_model_offers_what_mig_parted_and_gke_configure_for_it(
            self, model: MigModel) -> None:
        offered = {name for layout in PARTED[model.name] + GKE.get(model.name, [])
                   for name in layout}
        assert offered == set(model.profiles)

    @pytest.mark.parametrize("model", ALL)
    def test_a_whole_gpu_config_is_the_max_count(self, model: MigModel) -> None:
        """mig-parted's `all-<size>` (one size) and GKE's count per size fill one GPU."""
        for layout in PARTED[model.name] + GKE.get(model.name, []):
            if len(layout) == 1:
                [(name, count)] = layout.items()
                assert model.fill(name) == count, name

    @pytest.mark.parametrize("model", ALL)
    def test_gke_is_a_source_only_of_the_models_it_lists(self, model: MigModel) -> None:
        named = any("container-engine-accelerators" in source for source in model.sources)
        assert named == (model.name in GKE)
        assert any("mig-parted" in source and "bd7160f4" in source for source in model.sources)

    def test_gb200_has_the_production_sizes(self) -> None:
        """mig-parted's ebab1f77 and GKE: 1g.23gb (with +me), 1g.47gb, 2g.47gb, 3g.93gb,
        4g.93gb, 7g.186gb; the pre-production 1g.24gb, 3g.95gb, 4g.95gb, 7g.189gb gone."""
        gb200 = _by_name("GB200")
        assert list(gb200.profiles) == ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb",
                                        "3g.93gb", "4g.93gb", "7g.186gb"]


class TestProfiles:
    @pytest.mark.parametrize("model", ALL)
    def test_names_say_their_slices_and_memory(self, model: MigModel) -> None:
        for name, profile in model.profiles.items():
            match = re.fullmatch(r"([1-7])g\.([0-9]+)gb(\+me|\+me\.all|-me|\+gfx)?", name)
            assert match, name
            assert profile.name == name
            assert int(match[1]) == profile.slices
            assert float(match[2]) == profile.memory_gib

    @pytest.mark.parametrize("model", ALL)
    def test_memory_grows_with_slots_and_the_whole_gpu_is_the_7g_size(
            self, model: MigModel) -> None:
        whole = max(p.memory_gib for p in model.profiles.values())
        for profile in model.profiles.values():
            share = whole * profile.size / model.slots
            assert share * 0.85 <= profile.memory_gib <= share * 1.15 + 1, profile.name

    @pytest.mark.parametrize("model", ALL)
    def test_ids_are_nvmls_constants(self, model: MigModel) -> None:
        """NVML_GPU_INSTANCE_PROFILE_* and NVML_COMPUTE_INSTANCE_PROFILE_* as pynvml has them."""
        import pynvml

        def const(slices: int, variant: str = "") -> int:
            return int(getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{slices}_SLICE{variant}"))

        ci = {n: getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE")
              for n in (1, 2, 3, 4, 7)}
        for profile in model.profiles.values():
            n = profile.slices
            assert profile.ci_profile == ci[n]
            variant = {"+me": "_REV1", "+gfx": "_GFX", "-me": "_NO_ME", "+me.all": "_ALL_ME"}
            suffix = re.sub(r"^[0-9]g\.[0-9]+gb", "", profile.name)
            if suffix:
                assert profile.gi_profile == const(n, variant[suffix]), profile.name
            elif n == 1 and profile.size == 2:
                assert profile.gi_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
            else:
                assert profile.gi_profile == const(n)
        assert len({p.gi_profile for p in model.profiles.values()}) == len(model.profiles)

    @pytest.mark.parametrize("model", ALL)
    def test_placements_stay_on_the_gpu_and_give_the_max_count(self, model: MigModel) -> None:
        for profile in model.profiles.values():
            assert profile.placements == tuple(sorted(set(profile.placements)))
            assert all(s >= 0 and s + profile.size <= model.slots for s in profile.placements)
            assert all(s % profile.size == 0 for s in profile.placements)
            fit = min(len(profile.placements), model.compute_slices // profile.slices)
            assert profile.max_count <= fit
            assert model.fill(profile.name) == profile.max_count

    def test_a_size_the_model_lacks_fills_nothing(self) -> None:
        assert _by_name("A100-40GB").fill("1g.10gb+me") == 0
        assert _by_name("H100-80GB").fill("1g.5gb") == 0


class TestPacking:
    @pytest.mark.parametrize(("model", "layout"), [
        pytest.param(_by_name(name), layout, id=f"{name}-{_label(layout)}")
        for name, layouts in PARTED.items() for layout in layouts])
    def test_mig_parteds_layouts_fit(self, model: MigModel, layout: dict[str, int]) -> None:
        placed = model.pack(layout)
        assert placed is not None
        assert sorted(name for name, _ in placed) == sorted(
            name for name, count in layout.items() for _ in range(count))
        assert max(_slots(model, placed)) == 1
        assert all(start in model.profiles[name].placements for name, start in placed)

    @pytest.mark.parametrize("model", ALL)
    def test_every_layout_the_packer_accepts_is_a_real_placement(self, model: MigModel) -> None:
        """Every combination of up to 7 instances: accepted only within 7 compute slices,
        each instance at one of its placements, no slot used twice."""
        names = list(model.profiles)
        accepted = 0
        for size in range(1, 8):
            for combo in itertools.combinations_with_replacement(names, size):
                layout = {n: combo.count(n) for n in set(combo)}
                placed = model.pack(layout)
                if placed is None:
                    continue
                accepted += 1
                assert sum(model.profiles[n].slices for n in combo) <= model.compute_slices
                assert max(_slots(model, placed)) == 1
                assert all(count <= model.profiles[n].max_count for n, count in layout.items())
        assert accepted > 20

    def test_the_known_a100_refusals(self) -> None:
        """Layouts the MIG guide's A100 placement figure rules out despite fitting 7 slices."""
        a100 = _by_name("A100-40GB")
        assert a100.pack({"3g.20gb": 2, "1g.5gb": 1}) is None  # 3g takes 4 slots each
        assert a100.pack({"4g.20gb": 1, "2g.10gb": 2}) is None  # 8 compute slices
        assert a100.pack({"1g.10gb": 4, "1g.5gb": 1}) is None  # 8 slots
        assert a100.pack({"1g.5gb": 8}) is None
        assert a100.pack({"1g.5gb+me": 2}) is None
        assert a100.pack({"4g.20gb": 1, "3g.20gb": 1}) == [("4g.20gb", 0), ("3g.20gb", 4)]

    def test_fixed_instances_keep_their_place(self) -> None:
        a100 = _by_name("A100-40GB")
        placed = a100.pack({"2g.10gb": 3}, [("2g.10gb", 4)])
        assert placed is not None and placed[0] == ("2g.10gb", 4)
        assert sorted(start for _, start in placed) == [0, 2, 4]
        # a 3g.20gb at slot 0 blocks the 4g.20gb that only starts there
        assert a100.pack({"4g.20gb": 1, "3g.20gb": 1}, [("3g.20gb", 0)]) is None
        assert a100.pack({"1g.5gb": 1}, [("2g.10gb", 0)]) is None  # fixed but not wanted

    def test_unknown_sizes_do_not_pack(self) -> None:
        assert _by_name("H100-80GB").pack({"1g.5gb": 1}) is None
        assert _by_name("GB200").pack({"1g.24gb": 1}) is None
        assert _by_name("RTX-PRO-6000").pack({"1g.24gb": 2, "2g.48gb": 2}) is None
        assert _by_name("RTX-PRO-6000").pack({"1g.24gb+gfx": 2, "2g.48gb-me": 1}) is not None


def test_known_profile_spans_every_model() -> None:
    assert mig.known_profile("1g.5gb") and mig.known_profile("7g.186gb")
    assert mig.known_profile("1g.6gb") and mig.known_profile("4g.96gb+gfx")
    assert not mig.known_profile("7g.189gb") and not mig.known_profile("8g.80gb")
    assert mig.offered_by("1g.23gb") == ["B200", "GB200"]
    assert mig.offered_by("1g.24gb") == ["H100-94GB", "GH200-96GB", "RTX-PRO-6000"]
