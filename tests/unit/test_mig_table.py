"""The MIG profile table (installer/compat/mig.py): sizes, ids and placements per model, and
that NVIDIA's own mig-parted configs (`all-1g.*`, `all-balanced`, ...) fit each model."""

from __future__ import annotations

import itertools
import re

import pytest

from installer.compat import mig
from installer.compat.mig import MODELS, MigModel, mig_model

ALL = [pytest.param(model, id=model.name) for _, _, model in MODELS]

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
]

# mig-parted's config-default.yaml: each model's `all-<size>` and `all-balanced` layouts.
PARTED = {
    "A100-40GB": [{"1g.5gb": 7}, {"1g.5gb+me": 1}, {"1g.10gb": 4}, {"2g.10gb": 3},
                  {"3g.20gb": 2}, {"4g.20gb": 1}, {"7g.40gb": 1},
                  {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}],
    "A100-80GB": [{"1g.10gb": 7}, {"1g.10gb+me": 1}, {"1g.20gb": 4}, {"2g.20gb": 3},
                  {"3g.40gb": 2}, {"4g.40gb": 1}, {"7g.80gb": 1},
                  {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}],
    "H100-80GB": [{"1g.10gb": 7}, {"1g.10gb+me": 1}, {"1g.20gb": 4}, {"2g.20gb": 3},
                  {"3g.40gb": 2}, {"4g.40gb": 1}, {"7g.80gb": 1},
                  {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}],
    "H100-94GB": [{"1g.12gb": 7}, {"1g.12gb+me": 1}, {"1g.24gb": 4}, {"2g.24gb": 3},
                  {"3g.47gb": 2}, {"4g.47gb": 1}, {"7g.94gb": 1},
                  {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}],
    "H200-141GB": [{"1g.18gb": 7}, {"1g.18gb+me": 1}, {"1g.35gb": 4}, {"2g.35gb": 3},
                   {"3g.71gb": 2}, {"4g.71gb": 1}, {"7g.141gb": 1},
                   {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}],
    "B200": [{"1g.23gb": 7}, {"1g.23gb+me": 1}, {"1g.45gb": 4}, {"2g.45gb": 3},
             {"3g.90gb": 2}, {"4g.90gb": 1}, {"7g.180gb": 1},
             {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}],
    "GB200": [{"1g.24gb": 7}, {"1g.47gb": 4}, {"2g.47gb": 3}, {"3g.95gb": 2},
              {"4g.95gb": 1}, {"7g.189gb": 1}, {"1g.24gb": 2, "2g.47gb": 1, "3g.95gb": 1}],
}


def _by_name(name: str) -> MigModel:
    return next(model for _, _, model in MODELS if model.name == name)


def _slots(model: MigModel, placed: list[tuple[str, int]]) -> list[int]:
    """How many instances cover each of the 8 memory slots."""
    cover = [0] * mig.SLOTS
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
                                      "Tesla V100-SXM2-16GB", "NVIDIA RTX A6000"])
    def test_gpus_without_mig_have_no_model(self, name: str) -> None:
        assert mig_model(name, 24576) is None

    def test_only_ampere_needs_a_reset_for_a_mode_change(self) -> None:
        assert {m.name for _, _, m in MODELS if m.needs_reset} == {"A100-40GB", "A100-80GB"}

    @pytest.mark.parametrize("model", ALL)
    def test_every_model_names_its_sources(self, model: MigModel) -> None:
        assert model.sources and all(model.sources)

    @pytest.mark.parametrize("model", ALL)
    def test_every_model_offers_what_mig_parted_configures_for_it(self,
                                                                  model: MigModel) -> None:
        offered = {name for layout in PARTED[model.name] for name in layout}
        assert offered == set(model.profiles)


class TestProfiles:
    @pytest.mark.parametrize("model", ALL)
    def test_names_say_their_slices_and_memory(self, model: MigModel) -> None:
        for name, profile in model.profiles.items():
            match = re.fullmatch(r"([1-7])g\.([0-9]+)gb(\+me)?", name)
            assert match, name
            assert profile.name == name
            assert int(match[1]) == profile.slices
            assert float(match[2]) == profile.memory_gib

    @pytest.mark.parametrize("model", ALL)
    def test_memory_grows_with_slots_and_the_whole_gpu_is_the_7g_size(
            self, model: MigModel) -> None:
        whole = max(p.memory_gib for p in model.profiles.values())
        for profile in model.profiles.values():
            share = whole * profile.size / mig.SLOTS
            assert share * 0.85 <= profile.memory_gib <= share * 1.15 + 1, profile.name

    @pytest.mark.parametrize("model", ALL)
    def test_ids_are_nvmls_constants(self, model: MigModel) -> None:
        """NVML_GPU_INSTANCE_PROFILE_* and NVML_COMPUTE_INSTANCE_PROFILE_* as pynvml has them."""
        import pynvml

        gi = {1: pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
              2: pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
              3: pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
              4: pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
              7: pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE}
        ci = {1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
              2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
              3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
              4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
              7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE}
        for profile in model.profiles.values():
            assert profile.ci_profile == ci[profile.slices]
            if profile.name.endswith("+me"):
                assert profile.gi_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
            elif profile.slices == 1 and profile.size == 2:
                assert profile.gi_profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
            else:
                assert profile.gi_profile == gi[profile.slices]
        assert len({p.gi_profile for p in model.profiles.values()}) == len(model.profiles)

    @pytest.mark.parametrize("model", ALL)
    def test_placements_stay_on_the_gpu_and_give_the_max_count(self, model: MigModel) -> None:
        for profile in model.profiles.values():
            assert profile.placements == tuple(sorted(set(profile.placements)))
            assert all(s >= 0 and s + profile.size <= mig.SLOTS for s in profile.placements)
            assert all(s % profile.size == 0 for s in profile.placements)
            fit = min(len(profile.placements), mig.COMPUTE_SLICES // profile.slices)
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
                assert sum(model.profiles[n].slices for n in combo) <= mig.COMPUTE_SLICES
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
        assert _by_name("GB200").pack({"1g.24gb+me": 1}) is None


def test_known_profile_spans_every_model() -> None:
    assert mig.known_profile("1g.5gb") and mig.known_profile("7g.189gb")
    assert not mig.known_profile("1g.6gb") and not mig.known_profile("8g.80gb")
