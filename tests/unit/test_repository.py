"""index.json parsing and version resolution (installer.packages.repository)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from installer.errors import PackageNotFoundError
from installer.node.facts import NodeInfo, detect_node
from installer.node.host import RealHost, Roots
from installer.packages.repository import (
    Candidate,
    Index,
    IndexFormatError,
    flavour_order,
    index_to_bytes,
    parse_index,
    resolve,
    scan_tree,
    version_key,
    with_package,
)
from installer.testing import SAMPLE_NODES, build_node

K = "6.1.0-26-cloud-amd64"


def node(tmp_path: Path, name: str = "debian12-l4") -> NodeInfo:
    root = tmp_path / name
    if not root.exists():
        build_node(root, SAMPLE_NODES[name])
    return detect_node(RealHost(Roots(root, root / "proc", root / "sys", root / "dev")))


def cand(version: str, flavour: str = "proprietary", kernel: str = K, arch: str = "x86_64",
         **kw: Any) -> Candidate:
    return Candidate(version, kernel, arch, flavour, f"{kernel}/{version}/{flavour}", **kw)


CANDIDATES = [cand("535.54.03"), cand("535.261.03"), cand("535.261.03", "open"),
              cand("550.127.05", "open"), cand("550.90.07"), cand("470.256.02"),
              cand("535.300.01", kernel="6.1.0-27-cloud-amd64")]


class TestResolve:
    """exact, branch (newest of the branch), default, latest; aliases win; order kept."""

    @pytest.mark.parametrize(("requested", "aliases", "expected"), [
        ("535.54.03", {}, "535.54.03"),
        ("535", {}, "535.261.03"),
        ("550", {}, "550.127.05/open"),
        ("latest", {}, "550.127.05/open"),
        ("default", {}, "550.127.05/open"),
        ("default", {"default": "535"}, "535.261.03"),
        ("default", {"default": "470.256.02"}, "470.256.02"),
        ("535", {"535": "535.54.03"}, "535.54.03"),
        ("latest", {"latest": "535.261.03"}, "535.261.03"),
        ("latest", {"latest": "550.90.07"}, "550.90.07"),
    ])
    def test_versions(self, tmp_path: Path, requested: str, aliases: dict[str, str],
                      expected: str) -> None:
        """The newest version wins; within it, the GPU's preferred flavour (Ada: proprietary)."""
        chosen = resolve(requested, CANDIDATES, node(tmp_path), aliases=aliases)
        version, _, flavour = expected.partition("/")
        assert (chosen.driver_version, chosen.flavour) == (version, flavour or "proprietary")

    def test_numeric_order(self) -> None:
        assert version_key("535.261.03") > version_key("535.54.03")

    def test_flavour_auto_prefers_open_on_hopper(self, tmp_path: Path) -> None:
        hopper = node(tmp_path, "rocky9-h100x8")
        kernel = hopper.kernel_release
        offered = [cand("535.261.03", kernel=kernel), cand("535.261.03", "open", kernel=kernel)]
        assert flavour_order("auto", hopper) == ("open", "proprietary")
        assert resolve("535", offered, hopper).flavour == "open"
        assert resolve("535", offered, hopper, flavour="proprietary").flavour == "proprietary"

    def test_flavour_auto_on_ada(self, tmp_path: Path) -> None:
        assert flavour_order("auto", node(tmp_path)) == ("proprietary", "open")
        chosen = resolve("535", CANDIDATES, node(tmp_path), flavour="auto")
        assert (chosen.driver_version, chosen.flavour) == ("535.261.03", "proprietary")

    def test_open_only_version_on_auto(self, tmp_path: Path) -> None:
        chosen = resolve("550.127.05", CANDIDATES, node(tmp_path))
        assert chosen.flavour == "open"

    def test_allowed_filter(self, tmp_path: Path) -> None:
        chosen = resolve("latest", CANDIDATES, node(tmp_path),
                         allowed=lambda c: c.driver_version.startswith("535."))
        assert chosen.driver_version == "535.261.03"

    def test_earlier_source_wins(self, tmp_path: Path) -> None:
        first = cand("535.261.03", source="preloaded")
        second = cand("535.261.03", source="mirror")
        assert resolve("535", [first, second], node(tmp_path)).source == "preloaded"

    def test_os_match(self, tmp_path: Path) -> None:
        offered = [cand("535.261.03", os={"id": "ubuntu"}), cand("535.54.03", os={"id": "debian"})]
        assert resolve("latest", offered, node(tmp_path)).driver_version == "535.54.03"

    def test_other_arch_ignored(self, tmp_path: Path) -> None:
        with pytest.raises(PackageNotFoundError):
            resolve("535", [cand("535.261.03", arch="aarch64")], node(tmp_path))

    def test_not_found_lists_what_exists(self, tmp_path: Path) -> None:
        with pytest.raises(PackageNotFoundError) as caught:
            resolve("560", CANDIDATES, node(tmp_path))
        line = caught.value.one_line()
        assert "no driver package 560" in line
        assert f"for kernel {K}" in line
        assert ("550.127.05 (open), 550.90.07 (proprietary), 535.261.03 (proprietary/open), "
                "535.54.03 (proprietary), 470.256.02 (proprietary)") in line
        assert caught.value.code == 5

    def test_not_found_for_kernel(self, tmp_path: Path) -> None:
        other = [cand("535.261.03", kernel="5.15.0-1049-gke")]
        with pytest.raises(PackageNotFoundError, match=r"nothing for this kernel.*5\.15\.0-1049"):
            resolve("default", other, node(tmp_path))

    def test_alias_to_missing_version(self, tmp_path: Path) -> None:
        with pytest.raises(PackageNotFoundError, match=r"default \(= 545.29.06\)"):
            resolve("default", CANDIDATES, node(tmp_path), aliases={"default": "545.29.06"})

    def test_allowed_rejections_reported(self, tmp_path: Path) -> None:
        with pytest.raises(PackageNotFoundError, match="refused by the compatibility check"):
            resolve("535", CANDIDATES, node(tmp_path), allowed=lambda c: False)


def index_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": 1, "aliases": {"default": "535", "latest": "550.90.07"},
        "packages": [{"driver_version": "535.261.03", "kernel_release": K, "arch": "x86_64",
                      "flavour": "proprietary", "path": f"{K}/535.261.03/proprietary",
                      "manifest_sha256": "d" * 64, "os": None}]}
    doc.update(changes)
    return doc


class TestIndex:
    """index.json is validated as strictly as a manifest."""

    def test_round_trip(self) -> None:
        index = parse_index(json.dumps(index_doc()).encode())
        assert index.aliases == {"default": "535", "latest": "550.90.07"}
        assert parse_index(index_to_bytes(index)) == index

    def test_with_package_replaces(self) -> None:
        index = parse_index(json.dumps(index_doc()).encode())
        updated = with_package(index, cand("535.261.03", manifest_sha256="e" * 64),
                               {"default": "535.261.03"})
        assert [c.manifest_sha256 for c in updated.packages] == ["e" * 64]
        assert updated.aliases["default"] == "535.261.03"

    @pytest.mark.parametrize(("doc", "message"), [
        (index_doc(schema_version=9), "not supported"),
        (index_doc(extra=1), "must be an object of"),
        (index_doc(aliases={"stable": "535"}), "alias names"),
        (index_doc(aliases={"default": "newest"}), "not a version or branch"),
        (index_doc(packages=[{"driver_version": "535.261.03"}]), "must be an object with"),
        (index_doc(packages=[{**index_doc()["packages"][0], "path": "../../etc"}]),
         "must be '6.1.0-26"),
        (index_doc(packages=[{**index_doc()["packages"][0], "manifest_sha256": "xyz"}]),
         "64 lowercase hex"),
        (index_doc(packages=[{**index_doc()["packages"][0], "flavour": "closed"}]),
         "is not known"),
        (index_doc(packages=index_doc()["packages"] * 2), "twice"),
    ])
    def test_refused(self, doc: dict[str, Any], message: str) -> None:
        with pytest.raises(IndexFormatError, match=message.replace("(", r"\(")) as caught:
            parse_index(json.dumps(doc).encode())
        assert caught.value.code == 7

    @pytest.mark.parametrize("data", [b"", b"{]", b"[]", b"\x00"])
    def test_malformed(self, data: bytes) -> None:
        with pytest.raises(IndexFormatError):
            parse_index(data)

    @given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                            st.sampled_from(["schema_version", "packages", "aliases",
                                             "driver_version", "path"]), inner, max_size=3),
                        max_leaves=10))
    def test_hypothesis(self, value: Any) -> None:
        try:
            index = parse_index(json.dumps(value).encode())
        except IndexFormatError:
            return
        assert parse_index(index_to_bytes(index)) == index

    def test_scan_tree(self, tmp_path: Path) -> None:
        (tmp_path / K / "535.261.03" / "open").mkdir(parents=True)
        (tmp_path / K / "535.261.03" / "open" / "manifest.json").write_text("{}")
        (tmp_path / K / "550.90.07").mkdir(parents=True)
        (tmp_path / K / "550.90.07" / "proprietary.tar.gz").write_bytes(b"")
        (tmp_path / K / "junk" / "open").mkdir(parents=True)
        (tmp_path / K / "junk" / "open" / "manifest.json").write_text("{}")
        found = {(c.driver_version, c.flavour) for c in scan_tree(tmp_path)}
        assert found == {("535.261.03", "open"), ("550.90.07", "proprietary")}
        assert Index() == Index((), {})
