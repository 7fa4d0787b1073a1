"""compat.nodelabels.mig_labels: gpu-feature-discovery's MIG labels for both strategies,
valid as Kubernetes label keys and values; and the label patch keeps mig.config.state."""

from __future__ import annotations

from installer.compat.nodelabels import (
    MIG_STATE,
    MigFacts,
    label_patch,
    mig_labels,
    valid_key,
    valid_value,
)

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"


def _valid(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        assert valid_key(key) and valid_value(value), (key, value)


class TestSingle:
    def test_gke_seven_slices_on_eight_a100(self) -> None:
        gpus = [MigFacts(A100, 40960, True, (("1g.5gb", 7),))] * 8
        labels = mig_labels(gpus, strategy="single", prefix="nvidia.com")
        assert labels == {"nvidia.com/mig.strategy": "single",
                          "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                          "nvidia.com/gpu.count": "56", "nvidia.com/gpu.memory": "5120",
                          "nvidia.com/gpu.slices.gi": "1", "nvidia.com/gpu.slices.ci": "1"}
        _valid(labels)

    def test_not_uniform_falls_back_to_mixed(self) -> None:
        gpus = [MigFacts(H100, 81559, True, (("1g.10gb", 2), ("2g.20gb", 1))),
                MigFacts(H100, 81559, False, ())]
        labels = mig_labels(gpus, strategy="single")
        assert labels["gpu-node-installer/mig.strategy"] == "mixed"
        assert labels["gpu-node-installer/mig-1g.10gb.count"] == "2"
        assert "gpu-node-installer/gpu.product" not in labels


class TestMixed:
    def test_counts_per_profile(self) -> None:
        gpus = [MigFacts(H100, 81559, True, (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)))
                ] * 2
        labels = mig_labels(gpus, strategy="mixed", prefix="nvidia.com")
        assert labels["nvidia.com/mig.strategy"] == "mixed"
        assert labels["nvidia.com/mig-1g.10gb.count"] == "4"
        assert labels["nvidia.com/mig-2g.20gb.count"] == "2"
        assert labels["nvidia.com/mig-3g.40gb.count"] == "2"
        assert labels["nvidia.com/mig-3g.40gb.slices.gi"] == "3"
        assert labels["nvidia.com/mig-3g.40gb.memory"] == "40960"
        _valid(labels)

    def test_plus_me_profile_is_a_valid_key(self) -> None:
        labels = mig_labels([MigFacts(A100, 40960, True, (("1g.5gb+me", 1),))],
                            strategy="mixed")
        assert labels["gpu-node-installer/mig-1g.5gb-me.count"] == "1"
        _valid(labels)


class TestNoMig:
    def test_nothing_without_mig(self) -> None:
        assert mig_labels([MigFacts(A100, 40960, False, ())], strategy="single") == {}


class TestPatch:
    def test_state_label_survives_the_signal_patch(self) -> None:
        patch = label_patch({MIG_STATE: "success", "gpu-node-installer/gpu.count": "8"}, None,
                            {"gpu-node-installer/gpu.count": "56"})
        assert MIG_STATE not in patch["metadata"]["labels"]  # neither set nor removed


# What NVML's nvmlDeviceGetAttributes gives for an A100-40GB 1g.5gb MIG device (GFD labels
# these as they are: k8s-device-plugin internal/lm/resource.go @ 1b826acc)
NVML_1G5 = {"memory": 4864, "multiprocessors": 14, "slices.gi": 1, "slices.ci": 1,
            "engines.copy": 1, "engines.decoder": 0, "engines.encoder": 0,
            "engines.jpeg": 0, "engines.ofa": 0}


class TestNvmlFigures:
    def test_single_labels_nvml_memory_and_engines(self) -> None:
        gpus = [MigFacts(A100, 40960, True, (("1g.5gb", 7),), {"1g.5gb": NVML_1G5})] * 8
        labels = mig_labels(gpus, strategy="single", prefix="nvidia.com")
        assert labels["nvidia.com/gpu.memory"] == "4864"  # NVML's figure, not 5 GiB
        assert labels["nvidia.com/gpu.multiprocessors"] == "14"
        assert labels["nvidia.com/gpu.engines.copy"] == "1"
        assert labels["nvidia.com/gpu.engines.ofa"] == "0"
        _valid(labels)

    def test_mixed_per_profile_with_table_fallback(self) -> None:
        gpus = [MigFacts(A100, 40960, True, (("1g.5gb", 2), ("3g.20gb", 1)),
                         {"1g.5gb": NVML_1G5})]
        labels = mig_labels(gpus, strategy="mixed")
        assert labels["gpu-node-installer/mig-1g.5gb.memory"] == "4864"
        assert labels["gpu-node-installer/mig-1g.5gb.engines.jpeg"] == "0"
        # no NVML figure recorded for 3g.20gb: the table's nominal size, no engines
        assert labels["gpu-node-installer/mig-3g.20gb.memory"] == "20480"
        assert "gpu-node-installer/mig-3g.20gb.engines.copy" not in labels
        _valid(labels)


class TestRecordedFigures:
    def test_doctored_figures_label_nothing(self) -> None:
        from installer.installdir.migrecord import attributes

        good = {"profile": "1g.5gb", "attributes": NVML_1G5}
        assert attributes({"mig_devices": [good]}) == {"1g.5gb": NVML_1G5}
        for bad in ({"memory": "4864"}, {"memory": -1}, {"memory": True},
                    {"bad key/x": 1}, {"memory": 1 << 50}, []):
            row = {"mig_devices": [{"profile": "1g.5gb", "attributes": bad}]}
            assert attributes(row) == {}, bad
        assert attributes({"mig_devices": [{"profile": 7, "attributes": NVML_1G5}]}) == {}
