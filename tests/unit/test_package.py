"""Manifest validation and tarball reading (packages.manifest): each violation, one clear line."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.errors import IntegrityError
from installer.packages.manifest import (
    FileEntry,
    Manifest,
    ManifestError,
    ModuleEntry,
    Package,
    PackageFileError,
    dump_manifest,
    manifest_from_dict,
    manifest_to_dict,
    parse_manifest,
)
from installer.packages.tar import unpack_tarball
from installer.packages.tree import read_tree

SHA = "a" * 64


def valid() -> dict[str, Any]:
    return {
        "schema_version": 1, "driver_version": "535.261.03",
        "kernel_release": "6.1.0-26-cloud-amd64", "arch": "x86_64", "flavour": "proprietary",
        "os": {"id": "debian", "version_id": "12"},
        "files": [
            {"path": "modules/nvidia.ko", "size": 10, "sha256": SHA, "mode": 0o644,
             "kind": "module"},
            {"path": "modules/nvidia-uvm.ko", "size": 10, "sha256": "b" * 64, "mode": 0o644,
             "kind": "module"},
            {"path": "lib64/libcuda.so.535.261.03", "size": 5, "sha256": "c" * 64,
             "mode": 0o755, "kind": "library"},
        ],
        "modules": [
            {"name": "nvidia", "file": "modules/nvidia.ko", "depends": ["drm"], "params": {}},
            {"name": "nvidia_uvm", "file": "modules/nvidia-uvm.ko", "depends": ["nvidia"],
             "params": {"uvm_perf_prefetch_enable": "1"}},
        ],
        "links": [{"path": "lib64/libcuda.so.1", "target": "libcuda.so.535.261.03"}],
    }


def mutate(path: str, value: Any) -> dict[str, Any]:
    """A valid manifest with one field (dotted path, list indexes as numbers) changed."""
    doc = copy.deepcopy(valid())
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is _DELETE:
        del node[int(last) if last.isdigit() else last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return doc


class _Delete:
    """The mutation that removes the field (its repr stays the same in every process, so
    the parametrized ids do too)."""

    def __repr__(self) -> str:
        return "DELETE"


_DELETE = _Delete()


class TestValidManifest:
    """A correct manifest parses into the shared contract and round-trips byte for byte."""

    def test_fields(self) -> None:
        manifest = manifest_from_dict(valid())
        assert manifest.driver_version == "535.261.03"
        assert manifest.files[0] == FileEntry("modules/nvidia.ko", 10, SHA, 0o644, "module")
        assert manifest.modules[1] == ModuleEntry("nvidia_uvm", "modules/nvidia-uvm.ko",
                                                  ("nvidia",), {"uvm_perf_prefetch_enable": "1"})
        assert manifest.key == "6.1.0-26-cloud-amd64/535.261.03/proprietary"
        assert manifest.total_size == 25

    def test_round_trip(self) -> None:
        manifest = manifest_from_dict(valid())
        data = dump_manifest(manifest)
        assert parse_manifest(data) == manifest
        assert manifest_to_dict(manifest) == valid()

    def test_error_is_integrity_exit_code(self) -> None:
        with pytest.raises(IntegrityError) as caught:
            parse_manifest(b"{")
        assert caught.value.code == 7


BAD_MANIFESTS = [
    ("files.0.path", "/etc/passwd", "must be relative"),
    ("files.0.path", "../../etc/shadow", "'..'"),
    ("files.0.path", "modules/./nvidia.ko", "'.'"),
    ("files.0.path", "modules\\nvidia.ko", "must be relative and use '/'"),
    ("files.0.path", "modules//nvidia.ko", "empty"),
    ("files.0.path", "", "non-empty"),
    ("files.0.path", "a\nb", "control characters"),
    ("files.1.path", "modules/nvidia.ko", "duplicate path"),
    ("files.0.sha256", "A" * 64, "64 lowercase hex"),
    ("files.0.sha256", "a" * 63, "64 lowercase hex"),
    ("files.0.size", 100 * 1024**3, "must be an integer from 0 to"),
    ("files.0.size", -1, "must be an integer from 0 to"),
    ("files.0.size", True, "must be an integer"),
    ("files.0.mode", 0o4755, "must be an integer from 0 to 511"),
    ("files.0.kind", "script", "must be one of"),
    ("files.0.extra", 1, "unknown field extra"),
    ("files.0.sha256", _DELETE, "missing sha256"),
    ("schema_version", 2, "is not supported"),
    ("schema_version", True, "is not supported"),
    ("driver_version", "latest", "a driver version"),
    ("kernel_release", "../6.1", "a kernel release"),
    ("arch", "i386", "must be one of"),
    ("flavour", "closed", "must be one of"),
    ("os", {"id": 12}, "must be null or an object"),
    ("modules.0.file", "lib64/libcuda.so.535.261.03", "not a file of kind 'module'"),
    ("modules.0.depends", ["nvidia_uvm"], "must come before"),
    ("modules.1.name", "nvidia", "duplicate module"),
    ("modules.0.params", {"a": 1}, "must map parameter names to strings"),
    ("links.0.target", "../../etc/passwd", "must name a file of the package"),
    ("links.0.path", "lib64/libcuda.so.535.261.03", "duplicate path"),
    ("surprise", 1, "unknown field surprise"),
    ("files", [], "not a file of kind 'module'"),
]


class TestBadManifests:
    """Each violation is refused with a message that names the field."""

    @pytest.mark.parametrize(("path", "value", "message"), BAD_MANIFESTS,
                             ids=[f"{p}={str(v)[:20]}" for p, v, _ in BAD_MANIFESTS])
    def test_refused(self, path: str, value: Any, message: str) -> None:
        with pytest.raises(ManifestError) as caught:
            parse_manifest(json.dumps(mutate(path, value)).encode())
        line = caught.value.one_line()
        assert message in line
        assert "\n" not in line
        assert line.startswith("error(integrity): manifest")  # manifest.json when decoding

    def test_file_and_directory_clash(self) -> None:
        doc = valid()
        doc["files"].append({"path": "modules/nvidia.ko/x", "size": 1, "sha256": SHA,
                             "mode": 0o644, "kind": "config"})
        with pytest.raises(ManifestError, match="both a file and a directory"):
            manifest_from_dict(doc)

    @pytest.mark.parametrize("data", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'"x"'])
    def test_malformed_json(self, data: bytes) -> None:
        with pytest.raises(ManifestError):
            parse_manifest(data)

    def test_oversized_manifest(self) -> None:
        with pytest.raises(ManifestError, match="more than"):
            parse_manifest(b" " * (9 * 1024 * 1024))


class TestHypothesis:
    """Arbitrary input never escapes as anything but ManifestError; valid ones round-trip."""

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
            st.sampled_from(["path", "size", "files", "modules", "kind", "x"]), inner,
            max_size=4), max_leaves=12)

    @given(st.binary(max_size=200))
    def test_bytes(self, data: bytes) -> None:
        with contextlib.suppress(ManifestError):
            parse_manifest(data)

    @given(json_values)
    def test_json_shapes(self, value: Any) -> None:
        with pytest.raises(ManifestError):
            manifest_from_dict(value)

    @given(st.sampled_from([m[0] for m in BAD_MANIFESTS]),
           json_values)
    @settings(max_examples=200)
    def test_field_mutations(self, path: str, value: Any) -> None:
        try:
            manifest = manifest_from_dict(mutate(path, value))
        except ManifestError:
            return
        assert parse_manifest(dump_manifest(manifest)) == manifest

    @settings(deadline=None)  # a round-trip property, not a timing: a loaded machine is slow
    @given(st.lists(st.from_regex(r"[a-z0-9]{1,6}(/[a-z0-9._-]{1,6}){0,2}", fullmatch=True),
                    min_size=1, max_size=6, unique=True),
           st.integers(min_value=0, max_value=2**33))
    def test_valid_paths_round_trip(self, paths: list[str], size: int) -> None:
        if any(p.endswith((".", "..")) or "/./" in p or "/../" in p for p in paths):
            return
        doc = valid()
        doc["modules"], doc["links"] = [], []
        doc["files"] = [{"path": p, "size": size, "sha256": SHA, "mode": 0o644,
                         "kind": "config"} for p in paths]
        try:
            manifest = manifest_from_dict(doc)
        except ManifestError as exc:
            # entries that would land on one staged path are refused too
            assert any(text in exc.message for text in (
                "both a file and a directory", "total size", "staged at"))
            return
        assert parse_manifest(dump_manifest(manifest)) == manifest


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "modules").mkdir(parents=True)
    data = b"module bytes"
    (root / "modules" / "nvidia.ko").write_bytes(data)
    import hashlib

    manifest = Manifest(1, "535.261.03", "6.1.0-26-cloud-amd64", "x86_64", "open", None,
                        (FileEntry("modules/nvidia.ko", len(data),
                                   hashlib.sha256(data).hexdigest(), 0o644, "module"),),
                        (ModuleEntry("nvidia", "modules/nvidia.ko", (), {}),))
    (root / "manifest.json").write_bytes(dump_manifest(manifest))
    return root


class TestTree:
    """A package directory is verified file by file."""

    def test_verified(self, tmp_path: Path) -> None:
        package = read_tree(_tree(tmp_path))
        assert isinstance(package, Package)
        assert package.path_of("modules/nvidia.ko").read_bytes() == b"module bytes"

    def test_changed_file(self, tmp_path: Path) -> None:
        root = _tree(tmp_path)
        (root / "modules" / "nvidia.ko").write_bytes(b"module bytez")
        with pytest.raises(PackageFileError, match="sha256"):
            read_tree(root)

    def test_symlinked_file(self, tmp_path: Path) -> None:
        root = _tree(tmp_path)
        real = tmp_path / "elsewhere.ko"
        (root / "modules" / "nvidia.ko").rename(real)
        (root / "modules" / "nvidia.ko").symlink_to(real)
        with pytest.raises(PackageFileError, match="not a regular file"):
            read_tree(root)


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None


class TestTarball:
    """Tarball members that are links, devices or escape the root are refused."""

    def test_good(self, tmp_path: Path) -> None:
        root = _tree(tmp_path)
        tarball = tmp_path / "p.tar.gz"
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(root, arcname=".")
        out = unpack_tarball(tarball, tmp_path / "out")
        assert read_tree(out).manifest.flavour == "open"

    @pytest.mark.parametrize(("member", "message"), [
        (_special("lib64/libcuda.so.1", tarfile.SYMTYPE, "/etc/passwd"), "link or device"),
        (_special("lib64/hard", tarfile.LNKTYPE, "manifest.json"), "link or device"),
        (_special("dev/nvidia0", tarfile.CHRTYPE), "link or device"),
        (_special("fifo", tarfile.FIFOTYPE), "link or device"),
        (_file("../escape"), "'..'"),
        (_file("/etc/cron.d/evil"), "must be relative"),
        (_file("a/../../b"), "'..'"),
    ])
    def test_refused(self, tmp_path: Path, member: Any, message: str) -> None:
        tarball = _tar(tmp_path / "bad.tar", [_file("manifest.json", b"{}"), member])
        before = sorted(p.name for p in tmp_path.parent.iterdir())
        with pytest.raises(ManifestError, match=message.replace("(", r"\(")):
            unpack_tarball(tarball, tmp_path / "out")
        assert sorted(p.name for p in tmp_path.parent.iterdir()) == before
        assert not (tmp_path / "escape").exists()

    def test_duplicate_member(self, tmp_path: Path) -> None:
        tarball = _tar(tmp_path / "dup.tar", [_file("a"), _file("a")])
        with pytest.raises(ManifestError, match="duplicate member"):
            unpack_tarball(tarball, tmp_path / "out")

    def test_not_a_tarball(self, tmp_path: Path) -> None:
        bogus = tmp_path / "bogus.tar.gz"
        bogus.write_bytes(b"\x1f\x8b not really gzip")
        with pytest.raises(ManifestError, match="not a readable package tarball"):
            unpack_tarball(bogus, tmp_path / "out")

    def test_no_special_bits(self, tmp_path: Path) -> None:
        root = _tree(tmp_path)
        info, data = _file("modules/nvidia.ko", (root / "modules/nvidia.ko").read_bytes())
        info.mode = 0o4755
        manifest = _file("manifest.json", (root / "manifest.json").read_bytes())
        out = unpack_tarball(_tar(tmp_path / "m.tar", [manifest, (info, data)]),
                             tmp_path / "out")
        assert (out / "modules" / "nvidia.ko").stat().st_mode & 0o7777 == 0o600
