"""scripts/test-cost.py: a JUnit report summed per tier and module, kept per label, and the
table written between docs/testing.md's markers (the one in the repo must have them)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.host.test_agent.TestFabric" name="test_a" time="12.5"/>
<testcase classname="tests.host.test_agent" name="test_b" time="0.5"><failure message="x"/>
</testcase>
<testcase classname="tests.unit.test_config" name="test_c" time="0.25"/>
<testcase classname="tests.kernel.test_guest" name="test_d" time="90"><skipped message="no qemu"/>
</testcase>
</testsuite></testsuites>"""


@pytest.fixture
def cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_cost", REPO / "scripts/test-cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "test_cost", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    page = tmp_path / "testing.md"
    page.write_text(f"# Testing\n\nbefore\n{module.BEGIN}\nold table\n{module.END}\nafter\n")
    monkeypatch.setattr(module, "DATA", tmp_path / "test-cost.json")
    monkeypatch.setattr(module, "PAGE", page)
    (tmp_path / "junit.xml").write_text(REPORT)
    return module


def test_sums_per_tier_and_module_with_the_slowest_first(cost: ModuleType,
                                                         tmp_path: Path) -> None:
    summary = cost.summarise(cost.read_junit(tmp_path / "junit.xml"))
    assert summary["tests"] == 4 and summary["failed"] == 1 and summary["seconds"] == 103.2
    assert summary["tiers"] == {"host": [2, 13.0], "kernel": [1, 90.0], "unit": [1, 0.2]}
    assert summary["modules"]["tests/host/test_agent.py"] == [2, 13.0]
    assert summary["slowest"][0] == ["tests/kernel/test_guest.py::test_d", 90.0]


def test_each_label_keeps_its_column_and_the_page_is_rewritten_between_markers(
        cost: ModuleType, tmp_path: Path) -> None:
    report = str(tmp_path / "junit.xml")
    log = tmp_path / "prefetch.log"
    assert cost.main(["--label", "cold", "--from", report, "--prefetch-log", str(log)]) == 0
    assert cost.main(["--label", "warm", "--from", report, "--prefetch-log", str(log)]) == 0
    assert sorted(json.loads((tmp_path / "test-cost.json").read_text())) == ["cold", "warm"]
    page = (tmp_path / "testing.md").read_text()
    assert "old table" not in page and page.startswith("# Testing\n\nbefore\n")
    assert page.endswith(f"{cost.END}\nafter\n")
    assert "| measured | cold | warm |" in page and "| host | 2, 13.0 s | 2, 13.0 s |" in page
    assert "1. `tests/kernel/test_guest.py::test_d`: 90.0 s" in page


def test_the_manual_has_the_markers_once(cost: ModuleType) -> None:
    text = (REPO / "docs/testing.md").read_text()
    assert text.count(cost.BEGIN) == 1 and text.count(cost.END) == 1
    assert text.index(cost.BEGIN) < text.index(cost.END)


def test_wall_time_modules_and_what_the_prefetch_made_are_in_the_table(
        cost: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "prefetch.log"
    log.write_text("--- prefetch started 2026-12-04\n[kernel-assets] prefetch: old: ready in 9 s\n"
                   "--- prefetch started 2026-12-05 06:00:00\n"
                   "[kernel-assets] fetching x\n[kernel-assets] prefetch: NVIDIA 535 .debs: "
                   "ready in 41 s\n[kernel-assets] prefetch: arm64 root: FAILED after 3 s: "
                   "AssetError: no network\n")
    report = str(tmp_path / "junit.xml")
    assert cost.main(["--label", "cold", "--from", report, "--wall", "1500",
                      "--prefetch-log", str(log)]) == 0
    data = json.loads((tmp_path / "test-cost.json").read_text())["cold"]
    assert data["wall minutes"] == 25.0
    assert data["prefetch"] == [["NVIDIA 535 .debs", 41], ["arm64 root", "FAILED 3"]]
    page = (tmp_path / "testing.md").read_text()
    assert "| wall minutes | 25.0 |" in page
    assert "| NVIDIA 535 .debs | 41 |" in page and "| old |" not in page
    assert "| `tests/kernel/test_guest.py` | 1, 90.0 s |" in page
    assert "| 2 other modules | 3, 13.2 s |" in page
