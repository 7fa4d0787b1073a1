"""Bad strings from the hardware: a GPU whose NVML name or UUID is not UTF-8.

The real pynvml decodes both (`convertStrBytes`: `res.decode()`), so such bytes raise
UnicodeDecodeError, which once failed every metrics collection: no GPU was served. Each
case gives one GPU raw bytes through the NVML stand-in (FAKE_NVML_NAME_HEX,
FAKE_NVML_UUID_HEX), runs one collection and one scrape sandboxed (healthprobe.py
`metrics`, the real pynvml), and asserts that the other GPUs are served, the bad one is
listed unreadable with its cause, the one log line, and that nothing changed in the arena.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native import build_standins
from prometheus_client.parser import text_string_to_metric_families

from adversarial.harness import assert_untouched
from adversarial.sandboxed import Probe, run_probe, small_arena

GPUS = 4
NOT_UTF8_NAME = "NVIDIA A100\xff".encode("latin-1").hex()  # a lone 0xff byte
NOT_UTF8_UUID = b"GPU-\xc3\x28-0000".hex()  # a broken two-byte sequence


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standins(tmp_path_factory.mktemp("nvml"))


Series = dict[str, list[dict[str, str]]]


def collect(tmp_path: Path, lib_dir: Path, **env: str) -> tuple[Probe, Series]:
    arena = small_arena(tmp_path / "arena")
    before = arena.listing()
    probe = run_probe(arena, "metrics", str(arena.node), str(lib_dir),
                      env={"FAKE_NVML_GPUS": str(GPUS), **env})
    assert probe.code == 0, probe.stderr[-3000:]
    assert probe.result["status"] == 200
    assert_untouched(before, arena.listing())
    series: Series = {}
    for family in text_string_to_metric_families(probe.result["text"]):
        for sample in family.samples:
            series.setdefault(sample.name, []).append({**sample.labels,
                                                       "value": str(sample.value)})
    return probe, series


def served(series: Series) -> list[str]:
    return sorted(s["gpu"] for s in series.get("gpu_node_installer_gpu_memory_total_bytes", []))


def unreadable_lines(probe: Probe) -> list[dict[str, object]]:
    return [e for e in probe.events if e.get("event") == "GPU not served: unreadable"]


class TestNotUtf8:
    def test_every_gpu_is_served_when_the_strings_are_good(self, tmp_path: Path,
                                                           lib_dir: Path) -> None:
        probe, series = collect(tmp_path, lib_dir)
        assert served(series) == ["0", "1", "2", "3"]
        assert "gpu_node_installer_gpu_unreadable" not in series
        assert unreadable_lines(probe) == []

    @pytest.mark.parametrize(("variable", "value", "what"), [
        ("FAKE_NVML_NAME_HEX", f"1:{NOT_UTF8_NAME}", "name"),
        ("FAKE_NVML_UUID_HEX", f"1:{NOT_UTF8_UUID}", "UUID"),
        ("FAKE_NVML_UUID_HEX", "1:ff", "UUID"),
    ], ids=["name", "uuid", "uuid-one-byte"])
    def test_the_bad_gpu_is_unreadable_and_the_others_served(
            self, tmp_path: Path, lib_dir: Path, variable: str, value: str, what: str) -> None:
        probe, series = collect(tmp_path, lib_dir, **{variable: value})
        assert served(series) == ["0", "2", "3"]
        uuids = sorted(s["uuid"] for s in series["gpu_node_installer_gpu_memory_total_bytes"])
        node = sorted(s["accelerator_id"] for s in series["memory_total_gpu_node"])
        assert len(node) == 3 and node == uuids  # GKE's drop-in family too
        cause = f"its NVML {what} is not UTF-8"
        assert series["gpu_node_installer_gpu_unreadable"] == [
            {"gpu": "1", "reason": cause, "value": "1.0"}]
        errors = {s["source"]: s["value"]
                  for s in series["gpu_node_installer_collection_errors_total"]}
        assert errors["nvml_gpu"] == "1.0"  # (and podresources: no kubelet here)
        [line] = unreadable_lines(probe)
        assert (line["gpu"], line["reason"], line["level"]) == (1, cause, "warning")

    def test_two_bad_gpus_each_named(self, tmp_path: Path, lib_dir: Path) -> None:
        probe, series = collect(tmp_path, lib_dir, FAKE_NVML_NAME_HEX=f"0:{NOT_UTF8_NAME}",
                                FAKE_NVML_UUID_HEX=f"3:{NOT_UTF8_UUID}")
        assert served(series) == ["1", "2"]
        assert sorted((s["gpu"], s["reason"])
                      for s in series["gpu_node_installer_gpu_unreadable"]) == [
            ("0", "its NVML name is not UTF-8"), ("3", "its NVML UUID is not UTF-8")]
        assert [line["gpu"] for line in unreadable_lines(probe)] == [0, 3]
