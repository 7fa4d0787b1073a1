"""The compatibility hook of resolution, on host trees of real node shapes: refusals happen
before any download and name the versions that would work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from installer.cli import cli
from installer.compat import gpusupport
from installer.node.facts import NodeInfo, detect_node
from installer.node.host import RealHost, Roots
from installer.packages.repository import Candidate, Index, index_to_bytes, package_path, resolve
from installer.testing import NodeSpec, PciSpec, build_node

NodeMaker = Callable[[str], Path]
KEPLER_K80, VOLTA_V100, BLACKWELL_B200 = 0x102D, 0x1DB1, 0x2901


@dataclass(frozen=True)
class Offer:
    """A package a source offers, as resolution sees it."""

    driver_version: str
    flavour: str


OFFERS = [Offer(v, f) for v in ("470.256.02", "535.261.03", "570.124.06", "580.95.05",
                                "595.71.05") for f in ("open", "proprietary")]


def _node(root: Path) -> NodeInfo:
    return detect_node(RealHost(Roots(root, root / "proc", root / "sys", root / "dev")))


@pytest.fixture
def sample(make_node: NodeMaker) -> Callable[[str], NodeInfo]:
    return lambda name: _node(make_node(name))


@pytest.fixture
def custom(tmp_path: Path) -> Callable[..., NodeInfo]:
    def make(*devices: int) -> NodeInfo:
        root = tmp_path / "-".join(f"{d:04x}" for d in devices)
        root.mkdir()
        pci = tuple(PciSpec(f"0000:0{i + 4}:00.0", device, 0x030200)
                    for i, device in enumerate(devices))
        return _node(build_node(root, NodeSpec(os="debian-12", kernel="6.1.0-26-cloud-amd64",
                                               pci=pci)))
    return make


def _allowed(guard: Callable[[gpusupport.Offer], bool]) -> list[tuple[str, str]]:
    return [(o.driver_version, o.flavour) for o in OFFERS if guard(o)]


class TestRefusedBeforeDownload:
    def test_470_on_h100_node(self, sample: Callable[[str], NodeInfo]) -> None:
        node = sample("rocky9-h100x8")
        with pytest.raises(gpusupport.DriverUnsupportedGpuError) as info:
            gpusupport.guard("470.256.02", "auto", node, OFFERS)
        error = info.value
        assert error.code == 14 and "Hopper" in error.message
        assert error.remedy == ("set --driver-version to 535.261.03, 570.124.06, 580.95.05, "
                                "595.71.05")

    def test_580_on_k80_node(self, custom: Callable[..., NodeInfo]) -> None:
        with pytest.raises(gpusupport.DriverUnsupportedGpuError) as info:
            gpusupport.guard("580", "auto", custom(KEPLER_K80), OFFERS)
        assert "Kepler" in info.value.message
        assert info.value.remedy == "set --driver-version to 470.256.02"

    def test_alias_pointing_at_an_unsupported_version(
            self, sample: Callable[[str], NodeInfo]) -> None:
        with pytest.raises(gpusupport.DriverUnsupportedGpuError) as info:
            gpusupport.guard("default", "auto", sample("rocky9-h100x8"), OFFERS,
                         aliases={"default": "470.256.02"})
        assert "470.256.02 (the sources' `default`)" in info.value.message

    def test_proprietary_on_blackwell(self, custom: Callable[..., NodeInfo]) -> None:
        with pytest.raises(gpusupport.FlavourUnsupportedError) as info:
            gpusupport.guard("latest", "proprietary", custom(BLACKWELL_B200), OFFERS)
        assert info.value.code == 14 and "--flavour open" in info.value.remedy

    def test_open_on_volta(self, custom: Callable[..., NodeInfo]) -> None:
        with pytest.raises(gpusupport.FlavourUnsupportedError):
            gpusupport.guard("535.261.03", "open", custom(VOLTA_V100), OFFERS)

    def test_no_offers_still_names_the_branches(self, sample: Callable[[str], NodeInfo]
                                                ) -> None:
        with pytest.raises(gpusupport.DriverUnsupportedGpuError) as info:
            gpusupport.guard("440", "auto", sample("gke-cos-a100x8"), [])
        assert info.value.remedy == "set --driver-version to a driver of branch 450 or newer"


class TestDefaultAndLatestNeverPickUnsupported:
    def test_h100_filter_drops_470(self, sample: Callable[[str], NodeInfo]) -> None:
        guard = gpusupport.guard("latest", "auto", sample("rocky9-h100x8"), OFFERS)
        assert ("470.256.02", "proprietary") not in _allowed(guard)
        assert ("595.71.05", "open") in _allowed(guard)

    def test_k80_filter_keeps_only_470_proprietary(self, custom: Callable[..., NodeInfo]
                                                   ) -> None:
        guard = gpusupport.guard("default", "auto", custom(KEPLER_K80), OFFERS)
        assert _allowed(guard) == [("470.256.02", "proprietary")]

    def test_blackwell_filter_keeps_open_from_570(self, custom: Callable[..., NodeInfo]
                                                  ) -> None:
        guard = gpusupport.guard("latest", "auto", custom(BLACKWELL_B200), OFFERS)
        assert _allowed(guard) == [("570.124.06", "open"), ("580.95.05", "open"),
                                   ("595.71.05", "open")]

    def test_t4_accepts_every_offer_but_open_before_515(
            self, sample: Callable[[str], NodeInfo]) -> None:
        guard = gpusupport.guard("default", "auto", sample("gke-ubuntu-t4"), OFFERS)
        assert ("470.256.02", "open") not in _allowed(guard)
        assert len(_allowed(guard)) == len(OFFERS) - 1

    def test_unknown_gpu_is_not_blocked(self, sample: Callable[[str], NodeInfo]) -> None:
        guard = gpusupport.guard("latest", "auto", sample("debian12-future-gpu"), OFFERS)
        assert ("595.71.05", "open") in _allowed(guard)


class TestFlavourAuto:
    @pytest.mark.parametrize(("name", "flavour"), [
        ("rocky9-h100x8", "open"), ("gke-cos-a100x8", "proprietary"),
        ("gke-ubuntu-t4", "proprietary"), ("debian12-l4", "proprietary"),
        ("debian12-future-gpu", "open")])
    def test_sample_nodes(self, sample: Callable[[str], NodeInfo], name: str,
                          flavour: str) -> None:
        archs = gpusupport.node_architectures(sample(name))
        assert gpusupport.pick_flavour("auto", archs, "580.95.05") == flavour

    def test_blackwell_and_kepler(self, custom: Callable[..., NodeInfo]) -> None:
        assert gpusupport.pick_flavour("auto", gpusupport.node_architectures(
            custom(BLACKWELL_B200))) == "open"
        assert gpusupport.pick_flavour("auto", gpusupport.node_architectures(
            custom(KEPLER_K80))) == "proprietary"


class TestWithRepositoryResolve:
    """The hook plugged into `repository.resolve`, as the fetch stage plugs it in."""

    @staticmethod
    def _candidates(node: NodeInfo) -> list[Candidate]:
        return [Candidate(o.driver_version, node.kernel_release, node.kernel_arch, o.flavour,
                          package_path(node.kernel_release, o.driver_version, o.flavour))
                for o in OFFERS]

    def _resolve(self, requested: str, node: NodeInfo, flavour: str = "auto",
                 aliases: dict[str, str] | None = None) -> tuple[str, str]:
        candidates = self._candidates(node)
        allowed = gpusupport.guard(requested, flavour, node, candidates, aliases)
        choice = resolve(requested, candidates, node, flavour=flavour, aliases=aliases,
                         allowed=allowed)
        return choice.driver_version, choice.flavour

    def test_latest_on_k80_is_the_last_kepler_branch(self, custom: Callable[..., NodeInfo]
                                                     ) -> None:
        node = custom(KEPLER_K80)
        assert self._resolve("latest", node) == ("470.256.02", "proprietary")
        unfiltered = resolve("latest", self._candidates(node), node)
        assert unfiltered.driver_version == "595.71.05"

    def test_default_alias_on_h100_resolves_open(self, sample: Callable[[str], NodeInfo]
                                                 ) -> None:
        node = sample("rocky9-h100x8")
        assert self._resolve("default", node, aliases={"default": "535"}) == (
            "535.261.03", "open")

    def test_branch_before_open_modules_falls_back_to_proprietary(
            self, sample: Callable[[str], NodeInfo]) -> None:
        node = sample("debian12-future-gpu")
        assert self._resolve("470", node) == ("470.256.02", "proprietary")

    def test_blackwell_latest_is_open(self, custom: Callable[..., NodeInfo]) -> None:
        assert self._resolve("latest", custom(BLACKWELL_B200)) == ("595.71.05", "open")

    def test_refusal_comes_before_resolution(self, sample: Callable[[str], NodeInfo]) -> None:
        with pytest.raises(gpusupport.DriverUnsupportedGpuError):
            self._resolve("470.256.02", sample("rocky9-h100x8"))


class TestFetchStage:
    """`fetch` refuses before any package is read; `latest` picks what the GPU supports."""

    @staticmethod
    def _preloaded(root: Path, kernel: str) -> Path:
        """A preloaded tree whose index.json offers every OFFERS package but holds none:
        any attempt to read one fails with exit 5, so exit 14 proves the refusal came first."""
        preloaded = root / "preloaded"
        preloaded.mkdir()
        packages = tuple(Candidate(o.driver_version, kernel, "x86_64", o.flavour,
                                   package_path(kernel, o.driver_version, o.flavour))
                         for o in OFFERS)
        (preloaded / "index.json").write_bytes(index_to_bytes(Index(packages)))
        return preloaded

    def _fetch(self, root: Path, kernel: str, *args: str) -> tuple[int, str]:
        preloaded = self._preloaded(root.parent, kernel)
        result = CliRunner().invoke(cli, [
            "fetch", "--host-root", str(root), "--proc-root", str(root / "proc"),
            "--sys-root", str(root / "sys"), "--preloaded-dir", str(preloaded),
            "--termination-log", str(root.parent / "termination-log"), *args])
        return result.exit_code, result.stderr

    def test_470_on_h100_exits_14_before_reading_a_package(self, make_node: NodeMaker
                                                           ) -> None:
        root = make_node("rocky9-h100x8")
        code, err = self._fetch(root, "5.14.0-362.8.1.el9_3.x86_64",
                                "--driver-version", "470.256.02")
        assert code == 14, err
        assert "does not support the Hopper GPU(s)" in err
        assert "set --driver-version to 535.261.03, 570.124.06, 580.95.05, 595.71.05" in err

    def test_latest_on_h100_goes_for_the_newest_open_package(self, make_node: NodeMaker
                                                            ) -> None:
        root = make_node("rocky9-h100x8")
        code, err = self._fetch(root, "5.14.0-362.8.1.el9_3.x86_64",
                                "--driver-version", "latest")
        assert code == 5 and "595.71.05/open" in err

    def test_versions_reports_the_refusal(self, make_node: NodeMaker) -> None:
        root = make_node("rocky9-h100x8")
        preloaded = self._preloaded(root.parent, "5.14.0-362.8.1.el9_3.x86_64")
        result = CliRunner().invoke(cli, [
            "versions", "--host-root", str(root), "--proc-root", str(root / "proc"),
            "--sys-root", str(root / "sys"), "--preloaded-dir", str(preloaded),
            "--driver-version", "470.256.02"])
        assert result.exit_code == 5, result.stderr  # the report, then "nothing" as a code
        assert "470.256.02 -> nothing: driver 470.256.02 (branch 470) does not support" in (
            result.stdout)
        assert result.stderr.splitlines()[-1].startswith(
            "error(package-not-found): nothing for this node: driver 470.256.02 (branch 470) "
            "does not support")
