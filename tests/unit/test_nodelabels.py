"""compat.nodelabels: label syntax, GPU families, mixed nodes and the stale-label patch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from installer.compat import nodelabels
from installer.compat.nodelabels import OWNED_ANNOTATION, GpuFacts, gpu_labels, label_patch

P = "gpu-node-installer/"


class TestSyntax:
    def test_spaces_and_odd_characters(self) -> None:
        assert nodelabels.sanitize("NVIDIA A100-SXM4-40GB") == "NVIDIA-A100-SXM4-40GB"
        assert nodelabels.sanitize("  Tesla T4 (rev a1)  ") == "Tesla-T4-rev-a1"
        assert nodelabels.sanitize("x" * 80) == "x" * 63

    @given(st.text(max_size=120))
    def test_any_name_becomes_a_valid_value(self, name: str) -> None:
        assert nodelabels.valid_value(nodelabels.sanitize(name))

    def test_key_syntax(self) -> None:
        assert nodelabels.valid_key("gpu-node-installer/gpu.model.Tesla-T4")
        assert nodelabels.valid_key("nvidia.com/gpu.product")
        assert not nodelabels.valid_key("nvidia.com/-bad")
        assert not nodelabels.valid_key("Bad_Prefix/x")
        assert not nodelabels.valid_key("a/" + "x" * 64)


class TestFamilies:
    def test_from_compute_capability(self) -> None:
        got = {cc: nodelabels.family(cc, None) for cc in
               ("3.7", "6.0", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0")}
        assert got == {"3.7": "kepler", "6.0": "pascal", "7.0": "volta", "7.5": "turing",
                       "8.0": "ampere", "8.6": "ampere", "8.9": "ada-lovelace",
                       "9.0": "hopper", "10.0": "blackwell"}

    def test_from_the_pci_architecture_when_nvml_did_not_say(self) -> None:
        assert nodelabels.family(None, "Ada Lovelace") == "ada-lovelace"
        assert nodelabels.family(None, "unknown") is None


class TestLabels:
    def test_every_key_and_value_is_valid(self) -> None:
        gpus = [GpuFacts("NVIDIA H200 " + "x" * 70, 143771, "9.0"), GpuFacts("Tesla T4", 15360)]
        labels = gpu_labels(gpus, driver="570.86.15", cuda="12.8", flavour="open")
        assert all(nodelabels.valid_key(k) and nodelabels.valid_value(v)
                   for k, v in labels.items())
        assert labels[P + "gpu.product"] == "mixed"
        assert P + "gpu.compute.major" not in labels  # the T4's capability is unknown
        assert P + "gpu.family" not in labels

    def test_no_gpu_seen(self) -> None:
        labels = gpu_labels([], driver="535.261.03", cuda="12.2", flavour=None)
        assert labels[P + "gpu.count"] == "0"
        assert P + "gpu.product" not in labels


class TestPatch:
    def test_removes_only_ours(self) -> None:
        current = {P + "gpu.model.Tesla-T4": "1", P + "gpu.product": "Tesla-T4",
                   "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1",
                   "topology.kubernetes.io/zone": "a"}
        patch = label_patch(current, {OWNED_ANNOTATION: "nvidia.com/gpu.count"},
                            {P + "gpu.product": "NVIDIA-L4"})
        assert patch == {"metadata": {
            "labels": {P + "gpu.model.Tesla-T4": None, "nvidia.com/gpu.count": None,
                       P + "gpu.product": "NVIDIA-L4"},
            "annotations": {OWNED_ANNOTATION: None}}}

    def test_leaves_the_upgrade_state_and_the_operators_skip_label(self) -> None:
        """Signal's cleanup must not erase the upgrade's progress or an operator's opt-out."""
        current = {P + "upgrade-state": "validation-required", P + "upgrade.skip": "true",
                   P + "gpu.product": "Tesla-T4"}
        patch = label_patch(current, None, {P + "status": "ready"})
        assert patch["metadata"]["labels"] == {P + "gpu.product": None, P + "status": "ready"}

    def test_records_the_foreign_keys_it_writes(self) -> None:
        patch = label_patch({}, None, {"nvidia.com/gpu.product": "A", P + "status": "ready"})
        assert patch["metadata"] == {
            "labels": {"nvidia.com/gpu.product": "A", P + "status": "ready"},
            "annotations": {OWNED_ANNOTATION: "nvidia.com/gpu.product"}}
