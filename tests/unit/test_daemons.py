"""The manifest's `daemons` (strict, schema-checked) and what a fabric needs of them (exit 14).

`installer.packages.daemons` validates the field; `installer.installdir.daemons` says where
the staged daemons are (read back from the version's `.staged.json` through `.current`) and
refuses a node whose fabric needs a Fabric Manager the package lacks or has at another
version than the driver.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.config import load_config
from installer.errors import IncompatibleError
from installer.installdir import layout
from installer.installdir.daemons import (
    StagedDaemon,
    package_daemons,
    require_daemons,
    staged_daemons,
)
from installer.node.host import Roots
from installer.packages.manifest import (
    ManifestError,
    dump_manifest,
    manifest_from_dict,
    manifest_to_dict,
)
from tests.unit.test_package import valid
from tests.unit.test_schemas import MANIFEST

DRIVER = "535.261.03"
FM_FILES = {"bin/nv-fabricmanager": "d" * 64, "etc/fabricmanager.cfg": "e" * 64,
            "etc/dgxa100_hgxa100_topology": "f" * 64}
SM_FILES = {"bin/nvlsm": "1" * 64, "etc/nvlsm.conf": "2" * 64, "lib64/libgrpc_mgr.so": "3" * 64}
KINDS = {"bin": "binary", "etc": "config", "lib64": "library"}


def with_daemons(fm_version: str = DRIVER) -> dict[str, Any]:
    """The valid manifest of test_package plus Fabric Manager and NVLSM files and records."""
    doc = valid()
    for path, sha in {**FM_FILES, **SM_FILES}.items():
        kind = KINDS[path.split("/")[0]]
        doc["files"].append({"path": path, "size": 3, "sha256": sha,
                             "mode": 0o755 if kind == "binary" else 0o644, "kind": kind})
    doc["daemons"] = {
        "nv-fabricmanager": {"version": fm_version, "files": [
            {"path": p, "sha256": s} for p, s in sorted(FM_FILES.items())]},
        "nvlsm": {"version": "2025.06.6", "files": [
            {"path": p, "sha256": s} for p, s in sorted(SM_FILES.items())]}}
    return doc


def changed(edit: Any) -> dict[str, Any]:
    doc = copy.deepcopy(with_daemons())
    edit(doc)
    return doc


FM = ("daemons", "nv-fabricmanager")
BAD = [  # (change, words the one line must hold)
    (lambda d: d["daemons"].update({"dcgm": d["daemons"]["nvlsm"]}), "unknown daemon"),
    (lambda d: d["daemons"]["nvlsm"].update(version="v1"), "must be a version"),
    (lambda d: d["daemons"]["nvlsm"].update(version="1.2\n"), "must be a version"),
    (lambda d: d["daemons"]["nvlsm"].update(extra=1), "exactly version, files"),
    (lambda d: d["daemons"]["nvlsm"].pop("files"), "exactly version, files"),
    (lambda d: d["daemons"]["nvlsm"].update(files=[]), "non-empty list"),
    (lambda d: d["daemons"]["nvlsm"]["files"].append({"path": "bin/other", "sha256": "1" * 64}),
     "not a file of the package"),
    (lambda d: d["daemons"]["nvlsm"]["files"].append(d["daemons"]["nv-fabricmanager"]["files"][0]),
     "listed twice"),
    (lambda d: d["daemons"]["nvlsm"]["files"][0].update(sha256="9" * 64),
     "differs from the sha256"),
    (lambda d: d["daemons"]["nvlsm"]["files"][0].update(size=3), "exactly path, sha256"),
    (lambda d: d["daemons"]["nvlsm"]["files"].pop(0), "must hold the executable nvlsm"),
    (lambda d: d.update(daemons=[]), "must be an object"),
]


class TestManifestDaemons:
    """Optional, strict, and in step with docs/manifest.schema.json."""

    def test_daemons_parse_and_round_trip(self) -> None:
        doc = with_daemons()
        manifest = manifest_from_dict(doc)
        fm, sm = manifest.daemon("nv-fabricmanager"), manifest.daemon("nvlsm")
        assert fm is not None and sm is not None and manifest.daemon("nvidia-persistenced") is None
        assert (fm.version, fm.binary, fm.config) == (
            DRIVER, "bin/nv-fabricmanager", "etc/fabricmanager.cfg")
        assert (sm.version, sm.binary, sm.config) == ("2025.06.6", "bin/nvlsm", "etc/nvlsm.conf")
        assert manifest_to_dict(manifest) == doc
        assert json.loads(dump_manifest(manifest))["daemons"] == doc["daemons"]
        MANIFEST.validate(doc)

    def test_a_manifest_without_daemons_is_unchanged(self) -> None:
        """Old manifests stay valid with the same bytes, so the same digest."""
        manifest = manifest_from_dict(valid())
        assert manifest.daemons == ()
        assert "daemons" not in json.loads(dump_manifest(manifest))
        assert manifest_to_dict(manifest) == valid()

    @pytest.mark.parametrize(("edit", "words"), BAD, ids=[w for _, w in BAD])
    def test_refused_with_one_line(self, edit: Any, words: str) -> None:
        doc = changed(edit)
        with pytest.raises(ManifestError) as info:
            manifest_from_dict(doc)
        assert words in info.value.message and "daemons" in info.value.message
        assert "\n" not in info.value.one_line() and info.value.code == 7

    def test_the_executable_must_be_a_binary(self) -> None:
        doc = with_daemons()
        doc["files"][3]["kind"] = "config"  # bin/nv-fabricmanager as a config file
        with pytest.raises(ManifestError, match="must hold the executable nv-fabricmanager"):
            manifest_from_dict(doc)

    @pytest.mark.parametrize(("edit", "words"), [case for case in BAD if case[1] in (
        "unknown daemon", "must be a version", "exactly version, files", "non-empty list",
        "exactly path, sha256", "must be an object")], ids=lambda v: str(v)[:20])
    def test_schema_refuses_the_shape_errors(self, edit: Any, words: str) -> None:
        assert not MANIFEST.is_valid(changed(edit))


FIELDS = [("nvlsm", "version"), ("nvlsm", "files"), ("nvlsm", "extra"),
          ("nvlsm", "files", 0, "path"), ("nvlsm", "files", 0, "sha256"),
          ("nv-fabricmanager", "files", 1), ("nvidia-persistenced",)]


@given(st.sampled_from(FIELDS),
       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
                 st.sampled_from(["bin/nvlsm", "etc/nvlsm.conf", "2025.06.6", "1" * 64]),
                 st.lists(st.text(max_size=4), max_size=2)))
@settings(max_examples=300)
def test_parser_accepts_only_schema_valid_daemons(field: tuple[Any, ...], value: Any) -> None:
    """Whatever the parser takes, the schema takes too (the schema is never looser)."""
    doc = with_daemons()
    node: Any = doc["daemons"]
    for part in field[:-1]:
        node = node[part]
    node[field[-1]] = value
    try:
        manifest_from_dict(doc)
    except ManifestError:
        return
    MANIFEST.validate(doc)


def staged(name: str, version: str) -> StagedDaemon:
    return StagedDaemon(name, version, Path(f"/x/.current/bin/{name}"), None)


class TestRequireDaemons:
    """Exit 14 with the remedy when a fabric node's package cannot serve it."""

    def test_a_node_without_a_fabric_needs_nothing(self) -> None:
        require_daemons("none", {}, DRIVER)

    def test_nvswitch_without_fabric_manager_is_refused_with_the_remedy(self) -> None:
        with pytest.raises(IncompatibleError) as info:
            require_daemons("nvswitch", {"nvidia-persistenced": staged(
                "nvidia-persistenced", "535.171.04")}, DRIVER)
        line = info.value.one_line()
        assert info.value.code == 14 and "\n" not in line
        assert "NVSwitch" in line and "carries no nv-fabricmanager" in line
        assert f"--fabricmanager fabricmanager-linux-<arch>-{DRIVER}-archive.tar.xz" in line

    def test_nvlink5_needs_the_subnet_manager_too(self) -> None:
        with pytest.raises(IncompatibleError, match="needs nvlsm") as info:
            require_daemons("nvlink5", {"nv-fabricmanager": staged("nv-fabricmanager", DRIVER)},
                            DRIVER)
        assert "--nvlsm" in info.value.remedy and "--fabricmanager" not in info.value.remedy
        with pytest.raises(IncompatibleError, match="needs nv-fabricmanager and nvlsm"):
            require_daemons("nvlink5", {}, DRIVER)

    def test_fabric_manager_of_another_version_is_refused(self) -> None:
        with pytest.raises(IncompatibleError) as info:
            require_daemons("nvswitch", {"nv-fabricmanager": staged(
                "nv-fabricmanager", "535.247.01")}, DRIVER)
        assert info.value.code == 14
        assert info.value.message == (f"Fabric Manager 535.247.01 in the package differs from "
                                      f"the driver {DRIVER}; NVIDIA requires the same version")

    def test_a_complete_nvlink5_package_passes(self) -> None:
        require_daemons("nvlink5", {"nv-fabricmanager": staged("nv-fabricmanager", DRIVER),
                                    "nvlsm": staged("nvlsm", "2025.06.6")}, DRIVER)

    def test_an_unknown_kind_is_a_bug(self) -> None:
        with pytest.raises(ValueError, match="unknown fabric kind"):
            require_daemons("nvlink6", {}, DRIVER)


def host(tmp_path: Path) -> tuple[Any, Roots]:
    config = load_config({"host_root": str(tmp_path)}, {})
    return config, Roots.from_config(config)


def write_current(tmp_path: Path, meta: dict[str, Any]) -> Path:
    config, roots = host(tmp_path)
    install = layout.install_root(config, roots)
    version = install / layout.VERSIONS / "v1"
    version.mkdir(parents=True)
    (version / layout.STAGED_META).write_text(json.dumps(meta))
    (install / layout.CURRENT).symlink_to(f"{layout.VERSIONS}/v1")
    return install / layout.CURRENT


class TestStagedDaemons:
    """Read back through `.current`; a record this installer did not write counts as none."""

    def test_nothing_staged_means_no_daemons(self, tmp_path: Path) -> None:
        assert staged_daemons(*host(tmp_path)) == {}

    def test_the_package_daemons_are_where_staging_puts_them(self, tmp_path: Path) -> None:
        config, roots = host(tmp_path)
        planned = package_daemons(config, roots, manifest_from_dict(with_daemons()))
        current = layout.install_root(config, roots) / layout.CURRENT
        assert planned["nv-fabricmanager"] == StagedDaemon(
            "nv-fabricmanager", DRIVER, current / "bin/nv-fabricmanager",
            current / "etc/fabricmanager.cfg",
            tuple(current / p for p in sorted(FM_FILES)), "d" * 64)  # the binary's sha256
        assert planned["nvlsm"].config == current / "etc/nvlsm.conf"

    @pytest.mark.parametrize("record", [
        {"nvlsm": {"version": "1.0", "binary": "/usr/bin/nvlsm", "config": None, "files": []}},
        {"nvlsm": {"version": "1.0", "binary": "bin/../../nvlsm", "config": None, "files": []}},
        {"nvlsm": {"version": "1.0", "binary": "usr/nvlsm", "config": None, "files": []}},
        {"nvlsm": {"version": "x", "binary": "bin/nvlsm", "config": None, "files": []}},
        {"nvlsm": {"version": "1.0", "binary": "bin/nvlsm", "config": 3, "files": []}},
        {"dcgm": {"version": "1.0", "binary": "bin/dcgm", "config": None, "files": []}},
        ["nvlsm"],
        {"nvlsm": {"version": "1.0", "binary": "bin/nvlsm", "config": None, "files": [],
                   "sha256": "D" * 64}},
    ], ids=["absolute", "dotdot", "not-a-kind-dir", "version", "config", "unknown", "list",
            "sha256"])
    def test_a_foreign_record_is_ignored(self, tmp_path: Path, record: Any) -> None:
        write_current(tmp_path, {"digest": "a" * 64, "daemons": record})
        assert staged_daemons(*host(tmp_path)) == {}

    def test_a_record_is_read_under_current(self, tmp_path: Path) -> None:
        current = write_current(tmp_path, {"digest": "a" * 64, "daemons": {"nvidia-persistenced": {
            "version": "535.171.04", "binary": "bin/nvidia-persistenced", "config": None,
            "files": ["bin/nvidia-persistenced"]}}})
        assert staged_daemons(*host(tmp_path)) == {"nvidia-persistenced": StagedDaemon(
            "nvidia-persistenced", "535.171.04", current / "bin/nvidia-persistenced", None,
            (current / "bin/nvidia-persistenced",))}
