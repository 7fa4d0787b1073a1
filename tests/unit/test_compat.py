"""CUDA toolkit and GPU compatibility rules, row by row against NVIDIA's published table."""

from __future__ import annotations

import itertools

import pytest

from installer.compat import gpusupport
from installer.compat import toolkit as compat
from installer.compat.table import (
    ARCHITECTURE_BRANCHES,
    MINOR_VERSION_FLOORS,
    TOOLKIT_RELEASES,
    ToolkitRelease,
)
from installer.errors import ConfigError, IncompatibleError
from installer.node.gpus import ARCHITECTURES


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _one_below(version: str) -> str:
    """The version just under `version` (a bare branch `610` -> `609.999`)."""
    parts = _numbers(version)
    if len(parts) == 1:
        return f"{parts[0] - 1}.999"
    if parts[-1] > 0:
        return ".".join(str(p) for p in (*parts[:-1], parts[-1] - 1))
    return ".".join(str(p) for p in (*parts[:-2], parts[-2] - 1, 999))


def _exact(version: str) -> str:
    """A driver version the parser takes for a table minimum (a bare branch -> branch.0)."""
    return f"{version}.0" if "." not in version else version


ROWS = [pytest.param(row, id=row.version) for row in TOOLKIT_RELEASES]


class TestTable:
    """The data itself: ordered, monotonic, and naming the architectures gpus.py knows."""

    def test_releases_ascend_and_minimums_never_drop(self) -> None:
        versions = [_numbers(r.version) for r in TOOLKIT_RELEASES]
        assert versions == sorted(versions)
        minimums = [_numbers(r.min_driver) for r in TOOLKIT_RELEASES]
        assert all(a <= b for a, b in itertools.pairwise(minimums))

    def test_covers_cuda_10_0_to_13(self) -> None:
        minors = {".".join(r.version.split(".")[:2]) for r in TOOLKIT_RELEASES}
        assert {"10.0", "10.1", "10.2", "11.0", "11.8", "12.0", "12.9", "13.0", "13.2"} <= minors

    def test_architecture_keys_match_gpus_module(self) -> None:
        assert set(ARCHITECTURE_BRANCHES) == set(ARCHITECTURES)

    def test_minor_version_floors(self) -> None:
        assert MINOR_VERSION_FLOORS == {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


class TestEveryRow:
    """Each row: its minimum is compatible natively, one below is not."""

    @pytest.mark.parametrize("row", ROWS)
    def test_exact_minimum_is_native(self, row: ToolkitRelease) -> None:
        verdict = compat.check_cuda(row.version, _exact(row.min_driver))
        assert verdict.compatible and verdict.mode == compat.MODE_NATIVE
        assert verdict.release == row.label and verdict.minimum_driver == row.min_driver

    @pytest.mark.parametrize("row", ROWS)
    def test_one_below_minimum_is_not_native(self, row: ToolkitRelease) -> None:
        below = _one_below(row.min_driver)
        verdict = compat.check_cuda(row.version, below)
        assert verdict.mode != compat.MODE_NATIVE
        floor = MINOR_VERSION_FLOORS.get(_numbers(row.version)[0])
        by_minor = floor is not None and _numbers(below) >= _numbers(floor)
        assert verdict.compatible is by_minor
        assert verdict.mode == (compat.MODE_MINOR if by_minor else None)


class TestCudaBoundaries:
    def test_seed_driver_418_67_runs_cuda_10_1(self) -> None:
        verdict = compat.check_cuda("10.1", "418.67")
        assert verdict.compatible and verdict.mode == compat.MODE_NATIVE
        assert "418.39" in verdict.reason

    def test_cuda_10_has_no_minor_version_compatibility(self) -> None:
        verdict = compat.check_cuda("10.2", "418.67")
        assert not verdict.compatible and verdict.minor_version_floor is None
        assert "440.33" in verdict.reason

    @pytest.mark.parametrize(("cuda", "floor"), [
        ("11.8", "450.80.02"), ("12.9", "525.60.13"), ("13.2", "580.65.06")])
    def test_minor_version_floor_exact_and_one_below(self, cuda: str, floor: str) -> None:
        at = compat.check_cuda(cuda, floor)
        assert at.compatible and at.mode == compat.MODE_MINOR
        assert "minor version compatibility" in at.reason
        below = compat.check_cuda(cuda, _one_below(floor))
        assert not below.compatible and below.mode is None

    def test_newer_driver_runs_older_toolkit(self) -> None:
        verdict = compat.check_cuda("11.2", "580.95.05")
        assert verdict.compatible and verdict.mode == compat.MODE_NATIVE

    def test_update_releases_need_their_own_minimum(self) -> None:
        assert compat.minimum_driver_for_cuda("12.4") == "550.54.14"
        assert compat.minimum_driver_for_cuda("12.4.0") == "550.54.14"
        assert compat.minimum_driver_for_cuda("12.4.1") == "550.54.15"
        assert compat.minimum_driver_for_cuda("12.4.7") == "550.54.15"
        assert compat.check_cuda("12.2.2", "535.86.09").mode != compat.MODE_NATIVE

    def test_cuda_10_build_numbers_map_to_their_minor(self) -> None:
        assert compat.minimum_driver_for_cuda("10.1.243") == "418.39"
        assert compat.minimum_driver_for_cuda("10.0") == "410.48"

    def test_11_0_means_its_ga_not_the_release_candidate(self) -> None:
        assert compat.minimum_driver_for_cuda("11.0") == "450.51.05"
        assert compat.minimum_driver_for_cuda("11.0.1") == "450.36.06"

    def test_branch_only_rows_accept_any_driver_of_the_branch(self) -> None:
        assert compat.check_cuda("13.4", "615.10.01").mode == compat.MODE_NATIVE
        assert compat.check_cuda("13.4", "610.43.02").mode == compat.MODE_MINOR

    @pytest.mark.parametrize("cuda", ["12.7", "13.9"])
    def test_minor_not_in_table_falls_back_to_minor_version_rule(self, cuda: str) -> None:
        verdict = compat.check_cuda(cuda, "595.71.05")
        assert verdict.compatible and verdict.mode == compat.MODE_MINOR
        assert verdict.release is None and "newer than this table" in verdict.reason
        assert not compat.check_cuda(cuda, "470.82.01").compatible


class TestMalformed:
    @pytest.mark.parametrize("cuda", ["12", "12.x", "", "v12.4", "12.4.1.2", "twelve"])
    def test_bad_cuda_is_a_config_error(self, cuda: str) -> None:
        with pytest.raises(ConfigError) as info:
            compat.check_cuda(cuda, "535.261.03")
        assert info.value.code == 2 and "12.4" in info.value.remedy

    @pytest.mark.parametrize("driver", ["535", "abc", "535.261.03.1", "53.1", "", "535..1"])
    def test_bad_driver_is_a_config_error(self, driver: str) -> None:
        with pytest.raises(ConfigError) as info:
            compat.check_cuda("12.4", driver)
        assert info.value.code == 2 and "535.261.03" in info.value.remedy

    @pytest.mark.parametrize("cuda", ["9.2", "14.0", "99.1"])
    def test_majors_outside_the_table_are_config_errors(self, cuda: str) -> None:
        with pytest.raises(compat.UnknownCudaError) as info:
            compat.check_cuda(cuda, "535.261.03")
        assert info.value.code == 2 and "10.0" in info.value.message


class TestMaxCuda:
    @pytest.mark.parametrize(("driver", "expected"), [
        ("418.67", "10.1"), ("410.48", "10.0"), ("410.47", None), ("450.36.06", "10.2"),
        ("450.51.05", "11.0"), ("470.82.01", "11.4"), ("535.54.02", "12.1"),
        ("535.54.03", "12.2"), ("535.261.03", "12.2"), ("570.26", "12.8"),
        ("580.65.06", "13.0"), ("595.71.05", "13.2"), ("615.1.1", "13.4"),
        ("garbage", None), ("", None)])
    def test_newest_native_toolkit(self, driver: str, expected: str | None) -> None:
        assert compat.max_cuda_for_driver(driver) == expected

    @pytest.mark.parametrize(("driver", "major"), [
        ("418.67", None), ("450.80.02", 11), ("535.261.03", 12), ("580.65.06", 13)])
    def test_minor_compat_major(self, driver: str, major: int | None) -> None:
        assert compat.minor_compat_major(driver) == major

    def test_verdict_reports_it(self) -> None:
        verdict = compat.check_cuda("12.4", "535.261.03")
        assert verdict.max_cuda == "12.2"
        assert "12.2 (and any 12.x through minor version compatibility)" in verdict.to_text()


class TestGpuBranches:
    @pytest.mark.parametrize(("branch", "arch", "supported"), [
        (470, "Kepler", True), (535, "Kepler", False), (580, "Kepler", False),
        (580, "Maxwell", True), (590, "Maxwell", False), (580, "Pascal", True),
        (580, "Volta", True), (595, "Volta", False), (410, "Turing", True),
        (450, "Ampere", True), (440, "Ampere", False), (525, "Ada Lovelace", True),
        (520, "Ada Lovelace", False), (470, "Hopper", False), (520, "Hopper", False),
        (525, "Hopper", True), (565, "Blackwell", False), (570, "Blackwell", True),
        (390, "unknown", True), (999, "unknown", True)])
    def test_branch_supports(self, branch: int, arch: str, supported: bool) -> None:
        assert gpusupport.branch_supports(branch, arch) is supported

    def test_470_on_h100_is_refused_naming_working_versions(self) -> None:
        candidates = ["470.82.01", "535.261.03", "550.127.05", "580.95.05"]
        with pytest.raises(gpusupport.DriverUnsupportedGpuError) as info:
            gpusupport.check_driver_for_gpus("470.82.01", ["Hopper"], candidates=candidates)
        error = info.value
        assert isinstance(error, IncompatibleError) and error.code == 14
        assert "Hopper" in error.message and "525" in error.message
        assert "535.261.03, 550.127.05, 580.95.05" in error.remedy
        assert "470.82.01" not in error.remedy

    def test_580_on_k80_is_refused(self) -> None:
        with pytest.raises(gpusupport.DriverUnsupportedGpuError) as info:
            gpusupport.check_driver_for_gpus("580.95.05", ["Kepler"])
        assert "Kepler" in info.value.message and "branch 470 or older" in info.value.remedy

    def test_supported_pairs_pass(self) -> None:
        gpusupport.check_driver_for_gpus("535.261.03", ["Ampere", "Hopper"])
        gpusupport.check_driver_for_gpus("470", ["Kepler"])
        gpusupport.check_driver_for_gpus("535.261.03", [])

    def test_generations_no_branch_drives_together(self) -> None:
        with pytest.raises(gpusupport.DriverUnsupportedGpuError) as info:
            gpusupport.check_driver_for_gpus("535.261.03", ["Kepler", "Hopper"])
        assert "different nodes" in info.value.remedy

    def test_filter_versions_keeps_order_and_drops_junk(self) -> None:
        versions = ["580.95.05", "470.82.01", "junk", "535", "525.60.13", "520.61.05"]
        assert gpusupport.filter_versions(versions, ["Hopper"]) == [
            "580.95.05", "535", "525.60.13"]
        assert gpusupport.filter_versions(versions, ["Kepler"]) == ["470.82.01"]
        assert gpusupport.filter_versions(versions, ["Volta", "Turing"]) == [
            "580.95.05", "470.82.01", "535", "525.60.13", "520.61.05"]

    def test_supported_range_in_words(self) -> None:
        assert gpusupport.describe_range(gpusupport.supported_range(["Volta", "Ada Lovelace"])) == (
            "branches 525 to 580")
        assert gpusupport.describe_range(gpusupport.supported_range(["unknown"])) == "any branch"


class TestFlavour:
    @pytest.mark.parametrize(("archs", "expected"), [
        (["Hopper"], "open"), (["Blackwell"], "open"), (["unknown"], "open"),
        (["Ampere"], "proprietary"), (["Turing"], "proprietary"),
        (["Ada Lovelace"], "proprietary"), (["Volta"], "proprietary"),
        (["Kepler"], "proprietary"), (["Ampere", "Hopper"], "open"), ([], "proprietary")])
    def test_auto(self, archs: list[str], expected: str) -> None:
        assert gpusupport.pick_flavour("auto", archs) == expected

    def test_auto_before_open_modules_existed(self) -> None:
        assert gpusupport.pick_flavour("auto", ["Hopper"], "470.82.01") == "proprietary"

    def test_explicit_flavour_that_works_is_kept(self) -> None:
        assert gpusupport.pick_flavour("proprietary", ["Hopper"], "535.261.03") == "proprietary"
        assert gpusupport.pick_flavour("open", ["Ampere"], "535.261.03") == "open"

    def test_proprietary_on_blackwell_is_refused(self) -> None:
        with pytest.raises(gpusupport.FlavourUnsupportedError) as info:
            gpusupport.pick_flavour("proprietary", ["Blackwell"], "570.124.06")
        assert info.value.code == 14 and "Blackwell" in info.value.message
        assert "--flavour open" in info.value.remedy

    def test_open_on_volta_is_refused(self) -> None:
        with pytest.raises(gpusupport.FlavourUnsupportedError) as info:
            gpusupport.pick_flavour("open", ["Volta"])
        assert "Volta" in info.value.message and "--flavour proprietary" in info.value.remedy

    def test_open_before_515_is_refused(self) -> None:
        with pytest.raises(gpusupport.FlavourUnsupportedError) as info:
            gpusupport.pick_flavour("open", ["Turing"], "470.82.01")
        assert "515" in info.value.message

    def test_no_flavour_drives_volta_and_blackwell(self) -> None:
        with pytest.raises(gpusupport.FlavourUnsupportedError) as info:
            gpusupport.pick_flavour("auto", ["Volta", "Blackwell"])
        assert "different nodes" in info.value.remedy


class TestReadiness:
    """`.ready.json` tells operators which CUDA toolkits the installed driver runs."""

    def test_ready_document_names_the_newest_toolkit(self) -> None:
        from installer.config import Config
        from installer.context import Context
        from installer.stages.signal import ready_document
        from installer.stages.verify import VerifyResult

        verified = VerifyResult(driver_version="535.261.03", cuda_version="12.2",
                                kernel_release="6.1.0-26-cloud-amd64", flavour="proprietary",
                                digest=None, lib_dir="/x", gpus=(), cuda=None)
        document = ready_document(Context(config=Config(), host=None, log=None), verified)
        assert document["cuda_max_toolkit"] == "12.2"
        assert document["cuda_minor_version_compat_major"] == 12
