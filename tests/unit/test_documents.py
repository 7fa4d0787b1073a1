"""The bounded document reader and every parser built on it, and the
staged-path collision check (item 3).

Hypothesis feeds arbitrary bytes and near-valid documents to each parser: only the
installer's own errors (`InstallerError` subclasses) may come out.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from installer.config import Config
from installer.errors import InstallerError, IntegrityError
from installer.installdir import layout
from installer.installdir.readiness import load_ready
from installer.installdir.state import state_from_bytes
from installer.node.host import Host, Roots
from installer.packages import placement
from installer.packages.cache import ref_from_bytes
from installer.packages.documents import (
    MAX_DEPTH,
    MAX_NUMBER_CHARS,
    DocumentError,
    read_document,
    read_file,
)
from installer.packages.manifest import FileEntry, LinkEntry, ManifestError, parse_manifest
from installer.packages.repository import IndexFormatError, parse_index
from installer.packages.tar import unpack_tarball

SHA = "a" * 64
FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def read(data: bytes, **kwargs: Any) -> dict[str, Any]:
    return read_document(data, name="doc.json", source="a test", limit=1 << 20, **kwargs)


class TestLimits:
    """Each bound holds exactly at its edge, and each refusal names document and source."""

    def test_depth_edge(self) -> None:
        assert read(b'{"a":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}")
        with pytest.raises(DocumentError, match="nested deeper than"):
            read(b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}")

    def test_brackets_inside_strings_do_not_count(self) -> None:
        assert read(b'{"a": "' + b"[{" * 1000 + b'"}')["a"] == "[{" * 1000

    def test_deep_and_unbalanced_is_refused_without_recursion(self) -> None:
        for data in (b"[" * 1_000_000, b"]" * 1000, b"[{" * 50_000):
            with pytest.raises(DocumentError):
                read(data)

    def test_number_length_edge(self) -> None:
        assert read(b'{"a": ' + b"9" * MAX_NUMBER_CHARS + b"}")["a"] == int("9" * 32)
        with pytest.raises(DocumentError, match="a number of 33 characters"):
            read(b'{"a": ' + b"9" * (MAX_NUMBER_CHARS + 1) + b"}")
        with pytest.raises(DocumentError, match="a number of 1000000"):
            read(b'{"a": ' + b"1" * 1_000_000 + b"}")

    @pytest.mark.parametrize("data", [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}',
                                      b'{"a": 1e400}', b'{"a": -1e400}'])
    def test_non_finite(self, data: bytes) -> None:
        with pytest.raises(DocumentError):
            read(data)

    def test_size(self) -> None:
        with pytest.raises(DocumentError, match="more than the 10 bytes allowed"):
            read_document(b'{"a": "0123456789"}', name="x", limit=10)

    @pytest.mark.parametrize(("data", "cause"), [
        (b'{"a": "\\ud800"}', "lone surrogate U+D800"),
        (b'{"a": "\\udfff x"}', "lone surrogate U+DFFF"),
        (b'{"\\ud800": 1}', "lone surrogate"),
        (b'{"a": "\xed\xa0\x80"}', "not UTF-8"),  # a surrogate encoded as UTF-8
        (b'{"a": "\xff"}', "not UTF-8 (byte 0xff at offset 7)"),
        (b'\xef\xbb\xbf{"a": 1}', "not valid JSON"),
        (b'{"a": "\\u0000"}', "control characters, the first U+0000"),
        (b'{"a": "x\\u007f"}', "U+007F"),
        (b'{"a": "x\\u0085"}', "U+0085"),
        (b'{"a\\n": 1}', "U+000A"),
        (b'{"a": 1, "a": 1}', "duplicate key 'a'"),
        (b'{"a": {"b": 1, "b": 2}}', "duplicate key 'b'"),
        (b"[]", "top level is a JSON list"),
        (b"", "not valid JSON"),
    ])
    def test_refused(self, data: bytes, cause: str) -> None:
        with pytest.raises(DocumentError) as caught:
            read(data)
        assert cause in caught.value.message
        assert caught.value.message.startswith("doc.json from a test: ")
        assert caught.value.code == 7 and caught.value.message.isprintable()

    def test_surrogate_pairs_and_unicode_are_text(self) -> None:
        assert read(b'{"a": "\\ud83d\\ude00 caf\xc3\xa9"}')["a"] == "\U0001f600 caf\u00e9"

    def test_tab_only_in_free_text(self) -> None:
        assert read(b'{"name": "Tesla\\tT4"}', free_text=("name",))["name"] == "Tesla\tT4"
        with pytest.raises(DocumentError, match=r"U\+0009"):
            read(b'{"path": "a\\tb"}', free_text=("name",))
        with pytest.raises(DocumentError, match=r"U\+000A"):
            read(b'{"name": "a\\nb"}', free_text=("name",))

    def test_error_class_is_the_callers(self) -> None:
        with pytest.raises(IndexFormatError):
            read_document(b"{", name="index.json", limit=10, error=IndexFormatError)


class TestReadFile:
    """Node documents are read bounded, never through a FIFO, and only as regular files."""

    def test_absent_is_none(self, tmp_path: Path) -> None:
        assert read_file(tmp_path / "none.json", 10) is None

    def test_bounded(self, tmp_path: Path) -> None:
        (tmp_path / "big.json").write_bytes(b"x" * 1000)
        assert read_file(tmp_path / "big.json", 10) == b"x" * 11

    @pytest.mark.parametrize("make", [os.mkdir, os.mkfifo])
    def test_not_a_regular_file(self, tmp_path: Path, make: Callable[[Path], None]) -> None:
        make(tmp_path / "odd.json")
        with pytest.raises(DocumentError, match="not a regular file"):
            read_file(tmp_path / "odd.json", 10)


# ---------------------------------------------------------------- hypothesis: total parsers

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=20)


def index_doc() -> dict[str, Any]:
    return {"schema_version": 1, "aliases": {"default": "535.261.03"},
            "packages": [{"driver_version": "535.261.03", "kernel_release": "6.1.0-26-amd64",
                          "arch": "x86_64", "flavour": "open",
                          "path": "6.1.0-26-amd64/535.261.03/open",
                          "manifest_sha256": SHA, "os": None}]}


def manifest_doc() -> dict[str, Any]:
    return {"schema_version": 1, "driver_version": "535.261.03",
            "kernel_release": "6.1.0-26-amd64", "arch": "x86_64", "flavour": "open",
            "os": None,
            "files": [{"path": "modules/nvidia.ko", "size": 1, "sha256": SHA, "mode": 420,
                       "kind": "module"},
                      {"path": "lib/libcuda.so.535.261.03", "size": 1, "sha256": SHA,
                       "mode": 420, "kind": "library"}],
            "modules": [{"name": "nvidia", "file": "modules/nvidia.ko", "depends": [],
                         "params": {"NVreg_X": "1"}}],
            "links": [{"path": "lib/libcuda.so.1", "target": "libcuda.so.535.261.03"}]}


def state_doc() -> dict[str, Any]:
    return {"installer_version": "1.0", "requested_version": "default",
            "flavour_requested": "auto", "kernel_release": "6.1.0-26-amd64",
            "driver_version": "535.261.03", "flavour": "open", "package_digest": SHA,
            "timings_ms": {"fetch": 1.5}, "written_at": 1.0}


def ready_doc() -> dict[str, Any]:
    return {"driver_version": "535.261.03", "gpus": [{"index": 0, "name": "Tesla T4"}],
            "timings_ms": {"fetch": 1.0}, "written_at": "2026-12-01T00:00:00Z"}


def ref_doc() -> dict[str, Any]:
    return {"digest": SHA, "driver_version": "535.261.03", "kernel_release": "6.1.0",
            "arch": "x86_64", "flavour": "open", "os": None, "requested": ["default"],
            "last_used": 1.0}


@dataclass
class _Host:
    """Just enough of the host seam for `load_ready`: files from a dict."""

    roots: Roots
    data: bytes | None

    def read_bytes(self, path: Path, limit: int = 0) -> bytes | None:
        return self.data


_HOST = Path(tempfile.mkdtemp(prefix="gni-documents-"))  # the seam resolves under a real root


def _ready(data: bytes) -> Any:
    config = cast(Config, type("C", (), {"install_dir": PurePosixPath("/i")})())
    roots = Roots(_HOST, _HOST / "proc", _HOST / "sys", _HOST / "dev")
    return load_ready(config, cast(Host, _Host(roots, data)))


PARSERS: dict[str, tuple[Callable[[bytes], Any], Callable[[], dict[str, Any]]]] = {
    "index": (lambda d: parse_index(d, "mirror https://m.example"), index_doc),
    "manifest": (lambda d: parse_manifest(d, "mirror https://m.example/p"), manifest_doc),
    "state": (lambda d: state_from_bytes(d, "/i/.state.json"), state_doc),
    "readiness": (_ready, ready_doc),
    "cache ref": (lambda d: ref_from_bytes(d, Path(f"/c/refs/{SHA}.json")), ref_doc),
    "document": (read, index_doc),
}


def _only_ours(parse: Callable[[bytes], Any], data: bytes) -> None:
    try:
        parse(data)
    except InstallerError as exc:
        assert exc.code in (7, 11), exc
        assert exc.one_line().isprintable()


@pytest.mark.parametrize("kind", list(PARSERS))
class TestTotal:
    """Whatever the bytes, a parser returns or raises the installer's own error."""

    def test_valid_document_parses(self, kind: str) -> None:
        parse, doc = PARSERS[kind]
        assert parse(json.dumps(doc()).encode()) is not None

    @FAST
    @given(data=st.binary(max_size=400))
    def test_arbitrary_bytes(self, kind: str, data: bytes) -> None:
        _only_ours(PARSERS[kind][0], data)

    @FAST
    @given(path=st.lists(st.integers(0, 10), max_size=4), value=json_values)
    def test_one_value_replaced(self, kind: str, path: list[int], value: Any) -> None:
        parse, make = PARSERS[kind]
        doc = make()
        _replace(doc, path, value)
        _only_ours(parse, json.dumps(doc, allow_nan=True).encode())

    @FAST
    @given(at=st.integers(0, 10_000), splice=st.sampled_from([
        b"NaN", b"-Infinity", b'"\\ud800"', b'"\\u001b"', b"\xff", b"\xed\xa0\x80", b"[[[[",
        b"}", b'"a": 1, "a": 2,', b"9" * 40, b"1e999", b"\\", b'"', b",", b"\x00"]))
    def test_spliced_bytes(self, kind: str, at: int, splice: bytes) -> None:
        parse, make = PARSERS[kind]
        data = json.dumps(make()).encode()
        at %= len(data) + 1
        _only_ours(parse, data[:at] + splice + data[at:])


def _replace(doc: Any, path: list[int], value: Any) -> None:
    """Replace the value (or, in a dict, the key's value) the index path leads to."""
    node = doc
    for step in path:
        children = list(node.items()) if isinstance(node, dict) else \
            list(enumerate(node)) if isinstance(node, list) else []
        if not children:
            break
        key, child = children[step % len(children)]
        if not isinstance(child, dict | list) or step == path[-1]:
            node[key] = value
            return
        node = child
    if isinstance(node, dict) and node:
        node[next(iter(node))] = value


@FAST
@given(data=st.binary(max_size=2048))
def test_tarball_of_arbitrary_bytes(tmp_path_factory: pytest.TempPathFactory,
                                    data: bytes) -> None:
    work = tmp_path_factory.mktemp("tar")
    (work / "p.tar").write_bytes(data)
    try:
        unpack_tarball(work / "p.tar", work / "out")
    except InstallerError as exc:
        assert exc.code == 7


@FAST
@given(names=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4),
       sizes=st.lists(st.integers(0, 2**40), min_size=4, max_size=4),
       types=st.lists(st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.LNKTYPE,
                                       tarfile.SYMTYPE, tarfile.CHRTYPE, tarfile.CONTTYPE,
                                       tarfile.GNUTYPE_SPARSE]), min_size=4, max_size=4))
def test_tarball_of_arbitrary_headers(tmp_path_factory: pytest.TempPathFactory,
                                      names: list[str], sizes: list[int],
                                      types: list[bytes]) -> None:
    work = tmp_path_factory.mktemp("tar")
    out = io.BytesIO()
    for name, size, kind in zip(names, sizes, types, strict=False):
        info = tarfile.TarInfo(name)
        info.size, info.type = size, kind
        out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        out.write(b"\0" * min(size + (-size % 512), 4096))
    (work / "p.tar").write_bytes(out.getvalue())
    with pytest.raises(InstallerError) as caught:  # never a manifest among them: refused
        unpack_tarball(work / "p.tar", work / "out")
    assert caught.value.code == 7
    assert not (work / "out").exists()  # refused from the headers: nothing written


# ---------------------------------------------------------------- staged-path collisions

def _f(path: str, kind: str = "library") -> FileEntry:
    return FileEntry(path, 1, SHA, 0o644, kind)


class TestStagedClash:
    """Two entries landing on one staged path are refused, naming both."""

    @pytest.mark.parametrize(("files", "links", "words"), [
        ([_f("a/libx.so"), _f("b/libx.so")], [], ("files[0] 'a/libx.so'",
                                                    "files[1] 'b/libx.so'", "lib64/libx.so")),
        ([_f("a/libx.so"), _f("a/LIBX.so")], [], ("names equal ignoring case",)),
        ([_f("m/n.ko", "module"), _f("x/n.ko", "module")], [], ("drivers/n.ko",)),
        ([_f("bin/tool", "binary"), _f("sbin/Tool", "binary")], [], ("bin/Tool",)),
        ([_f("lib/firmware/nv/a.bin", "firmware"), _f("x/firmware/nv/a.bin", "firmware")], [],
         ("firmware/nv/a.bin",)),
        ([_f("lib/firmware/nv", "firmware"), _f("lib/firmware/nv/a.bin", "firmware")], [],
         ("needs as a directory",)),
        ([_f("a/libx.so.1"), _f("a/liby.so")], [LinkEntry("a/LIBY.so", "libx.so.1")],
         ("links[0] 'a/LIBY.so'", "files[1] 'a/liby.so'")),
        ([_f("a/libx.so.1"), _f("b/liby.so.1")],
         [LinkEntry("a/libz.so", "libx.so.1"), LinkEntry("b/libz.so", "liby.so.1")],
         ("links[0]", "links[1]", "lib64/libz.so")),
    ])
    def test_refused(self, files: list[FileEntry], links: list[LinkEntry],
                     words: tuple[str, ...]) -> None:
        clash = placement.staged_clash(files, links)
        assert clash is not None
        for word in words:
            assert word in clash

    def test_distinct_paths_pass(self) -> None:
        files = [_f("a/libx.so"), _f("a/liby.so"), _f("lib/firmware/nv/a.bin", "firmware"),
                 _f("lib/firmware/nv/b.bin", "firmware"), _f("m/nvidia.ko", "module")]
        assert placement.staged_clash(files, [LinkEntry("a/libx.so.1", "libx.so")]) is None

    def test_manifest_validation_refuses_with_exit_7(self) -> None:
        doc = manifest_doc()
        doc["files"].append({**doc["files"][1], "path": "lib32/libcuda.so.535.261.03"})
        with pytest.raises(ManifestError) as caught:
            parse_manifest(json.dumps(doc).encode(), source="mirror https://m.example")
        assert caught.value.code == 7
        assert caught.value.message.startswith("manifest.json from mirror https://m.example:")
        assert "would both be staged at lib64/libcuda.so.535.261.03" in caught.value.message

    @FAST
    @given(paths=st.lists(st.from_regex(r"\A[a-zA-Z]{1,3}(/[a-zA-Z]{1,3}){0,2}\Z"),
                          min_size=1, max_size=6, unique=True),
           kinds=st.lists(st.sampled_from(["library", "binary", "module", "firmware"]),
                          min_size=6, max_size=6))
    def test_never_two_on_one_path(self, paths: list[str], kinds: list[str]) -> None:
        files = [_f(p, k) for p, k in zip(paths, kinds, strict=False)]
        if placement.staged_clash(files, []) is None:
            staged = [str(placement.destination(f)).casefold() for f in files]
            assert len(set(staged)) == len(staged)


def test_layout_keeps_the_placement_names() -> None:
    """Other rooms import these from installer.installdir.layout: same objects."""
    assert layout.destination is placement.destination
    assert layout.KIND_DIRS is placement.KIND_DIRS


def test_documents_are_integrity_errors() -> None:
    assert issubclass(DocumentError, IntegrityError)
