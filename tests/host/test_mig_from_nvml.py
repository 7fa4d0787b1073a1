"""The GPU is the source of truth: where NVML answers a GPU's MIG profiles, the plan is made
from that answer (nvmlDeviceGetGpuInstanceProfileInfoV, the possible placements), the table
serving only where NVML answers none (MIG off on an R535 driver, as the stand-in answers).
As mig-parted does since 2026-02 (pkg/mig/discovery/discovery.go, commits 6ef7bf0e and
219e780d). The stand-in's FAKE_NVML_MIG_PROFILES makes a board whose driver answers other
counts or memory than the published table (a newer board)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e import events
from mignode import H100, MigNode, mig_node

from installer.compat.mig import mig_model
from installer.compat.mignvml import NvmlProfile, differences, from_nvml, memory_gb

MIB = 1 << 20


def _gke(node: MigNode, size: str) -> None:
    path = node.scene.root / "etc/nvidia/gpu_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"GPUPartitionSize": size}))


def _differs(stderr: str) -> list[dict[str, object]]:
    return [e for e in events(stderr) if str(e["event"]).startswith(
        "MIG profiles from NVML differ")]


def _h100_mig_on(tmp_path: Path, profiles: str) -> MigNode:
    node = mig_node(tmp_path, H100, 1)
    (node.mig_dir / "gpu0").write_text("mode 1 1\n")
    node.env["FAKE_NVML_MIG_PROFILES"] = profiles
    return node


class TestPlannedFromNvml:
    def test_fewer_instances_than_the_table_says(self, tmp_path: Path) -> None:
        """The board's driver offers 1g.10gb x4, the table x7: GKE's fill gives 4, as NVML
        says, and the log names the difference."""
        node = _h100_mig_on(tmp_path, "0x0:4")
        _gke(node, "1g.10gb")
        done = node.install()
        assert done.returncode == 0, done.stderr
        assert [p for _, p in node.gis(0)] == [0, 0, 0, 0]
        assert node.record()["gpus"][0]["devices"] == [["1g.10gb", 4]]
        (event,) = _differs(done.stderr)
        assert "1g.10gb: NVML x4" in str(event["differences"])
        assert "the table x7" in str(event["differences"])

    def test_a_board_the_table_does_not_know(self, tmp_path: Path) -> None:
        """An H100 with 86 GB (88064 MiB): the table's nearest model is the 80 GB one, but
        NVML names this board's sizes 1g.11gb, 3g.43gb, ... (go-nvlib's rule): GKE's
        1g.11gb is taken and created as NVML offers it, the table's 1g.10gb is refused
        naming the GPU's own sizes (exit 2), and nothing changes then."""
        node = mig_node(tmp_path, ("NVIDIA H100 86GB HBM3", 88064, 0x2330), 1)
        (node.mig_dir / "gpu0").write_text("mode 1 1\n")
        _gke(node, "1g.11gb")
        done = node.install()
        assert done.returncode == 0, done.stderr
        assert node.record()["gpus"][0]["devices"] == [["1g.11gb", 7]]
        (event,) = _differs(done.stderr)
        assert "1g.11gb only from NVML" in str(event["differences"])
        assert "1g.10gb only in the table" in str(event["differences"])
        before = node.states()
        (node.scene.root / "etc/nvidia/gpu_config.json").unlink()
        bad = node.run("partition", "--mig-profile", "1g.10gb")
        assert bad.returncode == 2, bad.stderr
        last = bad.stderr.splitlines()[-1]
        assert "1g.10gb" in last and "1g.11gb" in last and "3g.43gb" in last, last
        assert node.states() == before

    def test_the_table_where_nvml_answers_no_profiles(self, tmp_path: Path) -> None:
        """MIG off: the stand-in (as R535) answers no profile, so the plan is the table's;
        the log says so."""
        node = mig_node(tmp_path, H100, 1)
        _gke(node, "1g.10gb")
        done = node.install()
        assert done.returncode == 0, done.stderr
        assert node.record()["gpus"][0]["devices"] == [["1g.10gb", 7]]
        assert any(e["event"] == "MIG profiles from the table (NVML answered none)"
                   for e in events(done.stderr))
        assert not _differs(done.stderr)

    def test_asked_again_once_the_mode_is_on(self, tmp_path: Path) -> None:
        """MIG off at planning: the table's 1g.10gb x7. Once the mode is on NVML answers,
        x4 only: the layout is refused there (exit 14) naming NVML's offer, no instance
        made."""
        node = mig_node(tmp_path, H100, 1)
        node.env["FAKE_NVML_MIG_PROFILES"] = "0x0:4"
        _gke(node, "1g.10gb")
        done = node.install()
        assert done.returncode == 14, done.stderr
        last = done.stderr.splitlines()[-1]
        assert "cannot hold this layout" in last and "1g.10gb (x4)" in last, last
        assert node.gis(0) == []


# nvidia-smi mig -lgip on an A100-SXM4-40GB (40536 MiB): 1g.5gb 4.75 GiB, 3g.20gb 19.62 GiB,
# 7g.40gb 39.25 GiB; on an H100 80GB HBM3 (81559 MiB): 1g.10gb 9.75 GiB, 7g.80gb 79.00 GiB
@pytest.mark.parametrize(("device_mib", "memory_mb", "gb"), [
    (40536, 4864, 5), (40536, 20096, 20), (40536, 40192, 40), (81559, 9984, 10),
    (81559, 80896, 80)])
def test_names_as_go_nvlib(device_mib: int, memory_mb: int, gb: int) -> None:
    assert memory_gb(device_mib * MIB, memory_mb) == gb


def test_the_same_answer_as_the_table_differs_in_nothing() -> None:
    table = mig_model("NVIDIA A100-SXM4-40GB", 40536)
    assert table is not None
    found = [NvmlProfile(p.gi_profile, p.slices, p.max_count,
                         int(p.memory_gib * 1000 * 0.97),
                         tuple((s, p.size) for s in p.placements))
             for p in table.profiles.values()]
    model = from_nvml("NVIDIA A100-SXM4-40GB", 40536 * MIB, found, table)
    assert model is not None
    assert list(model.profiles) == sorted(table.profiles, key=lambda n: (
        table.profiles[n].slices, table.profiles[n].gi_profile))
    assert differences(model, table) == []
    assert (model.name, model.slots, model.needs_reset) == ("A100-40GB", 8, True)


def test_no_profiles_is_no_model() -> None:
    assert from_nvml("NVIDIA H100 80GB HBM3", 81559 * MIB, [], None) is None
