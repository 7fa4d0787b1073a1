"""Hostile documents: every index, manifest and node document is
read by one bounded, total parser, and files that would collide when staged are refused.

Each case: exit 7 (or the documented outcome for node documents), one line naming the
document and where it came from, no traceback, nothing written outside the work area.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adversarial.harness import (
    VERSION,
    WORK_AREA,
    Arena,
    Result,
    assert_refused,
    assert_untouched,
    install,
    install_preloaded,
    refused_untouched,
    settle,
)

Doc = dict[str, Any]


def _manifest_path(arena: Arena) -> Path:
    return next(arena.scene.repo.glob("*/*/*/manifest.json"))


def _publish_manifest(arena: Arena, data: bytes) -> None:
    """A hostile mirror serves its own manifest and an index whose digest matches it."""
    _manifest_path(arena).write_bytes(data)
    index = json.loads((arena.scene.repo / "index.json").read_text())
    index["packages"][0]["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (arena.scene.repo / "index.json").write_text(json.dumps(index))


def _edit_manifest(arena: Arena, edit: Callable[[Doc], None]) -> Doc:
    doc: Doc = json.loads(_manifest_path(arena).read_text())
    edit(doc)
    _publish_manifest(arena, json.dumps(doc).encode())
    return doc


def _refused(arena: Arena, write: Callable[[], None], *causes: str,
             run: Callable[[], Result] | None = None) -> Result:
    write()
    settle(arena)
    return refused_untouched(arena, run or (lambda: install(arena)), 7, *causes)


# ------------------------------------------------------------------ index.json on a mirror

HOSTILE_INDEXES: dict[str, tuple[bytes, str]] = {
    "deep nesting": (b'{"packages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                     "nested deeper than"),
    "a million-digit number": (b'{"schema_version": ' + b"9" * 1_000_000 + b"}",
                               "a number of 1000000 characters"),
    "NaN": (b'{"schema_version": NaN, "packages": []}', "NaN is not a JSON number"),
    "Infinity by overflow": (b'{"schema_version": 1e999, "packages": []}', "out of range"),
    "lone surrogate": (b'{"schema_version": 1, "aliases": {"default": "\\ud800"}}',
                       "lone surrogate U+D800"),
    "not UTF-8": (b'{"schema_version": 1, "aliases": {"default": "\xff\xfe"}}',
                  "not UTF-8 (byte 0xff"),
    "control character in a name": (
        b'{"schema_version": 1, "aliases": {"default": "535.261.03\\u001b[2J"}}',
        "control characters, the first U+001B"),
    "duplicate keys": (b'{"schema_version": 1, "schema_version": 1, "packages": []}',
                       "duplicate key 'schema_version'"),
    "a list at the top": (b"[1, 2, 3]", "not an object"),
}


@pytest.mark.parametrize("case", list(HOSTILE_INDEXES))
def test_hostile_index_on_a_mirror(arena: Arena, case: str) -> None:
    data, cause = HOSTILE_INDEXES[case]
    index = arena.scene.repo / "index.json"
    result = _refused(arena, lambda: index.write_bytes(data),
                      f"index.json from mirror file://{arena.scene.repo}", cause)
    assert "\x1b" not in result.lines[0]


def test_a_100_mb_index_is_refused_unread(arena: Arena) -> None:
    index = arena.scene.repo / "index.json"

    def write() -> None:
        with index.open("r+b") as handle:
            handle.truncate(100 * 1024 * 1024)  # sparse: cheap to make, costly to parse

    _refused(arena, write, "index.json", "larger than the 16777216 bytes allowed")


# ------------------------------------------------------------------ manifest.json on a mirror

def _second_library(name: str) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        first = doc["files"][0]
        doc["files"].append({**first, "path": name})
    return edit


def test_basename_collision_across_directories(arena: Arena) -> None:
    _refused(arena, lambda: _edit_manifest(arena, _second_library(
        "lib32/libcuda.so.535.261.03")), "manifest.json from mirror file://",
        "'lib64/libcuda.so.535.261.03'", "'lib32/libcuda.so.535.261.03'",
        "would both be staged at lib64/libcuda.so.535.261.03")


def test_case_folded_collision_in_one_staged_directory(arena: Arena) -> None:
    _refused(arena, lambda: _edit_manifest(arena, _second_library(
        "lib64/LIBCUDA.so.535.261.03")), "'lib64/libcuda.so.535.261.03'",
        "'lib64/LIBCUDA.so.535.261.03'", "names equal ignoring case")


def test_link_colliding_with_a_file(arena: Arena) -> None:
    def edit(doc: Doc) -> None:
        doc["links"] = [{"path": "lib64/LibNvidia-ML.so.535.261.03",
                         "target": "libcuda.so.535.261.03"}]

    _refused(arena, lambda: _edit_manifest(arena, edit), "links[0]",
             "'lib64/libnvidia-ml.so.535.261.03'", "would both be staged at")


def test_modules_of_two_kinds_flattened_to_one_name(arena: Arena) -> None:
    def edit(doc: Doc) -> None:
        doc["files"].append({**doc["files"][2], "path": "extra/nvidia.ko"})

    _refused(arena, lambda: _edit_manifest(arena, edit), "'modules/nvidia.ko'",
             "'extra/nvidia.ko'", "drivers/nvidia.ko")


HOSTILE_MANIFESTS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "control character in a module parameter": (
        lambda d: d.replace(b'"params": {}', b'"params": {"NVreg_X": "1\\nevil=1"}', 1),
        "control characters, the first U+000A"),
    "lone surrogate in a path": (
        lambda d: d.replace(b'"modules/nvidia.ko"', b'"modules/\\udc80nvidia.ko"', 1),
        "lone surrogate U+DC80"),
    "duplicate keys": (lambda d: d.replace(b'"arch": "x86_64"',
                                           b'"arch": "aarch64", "arch": "x86_64"', 1),
                       "duplicate key 'arch'"),
    "deep nesting": (lambda d: d.replace(b'"params": {}', b'"params": ' + b"[" * 5000
                                         + b"]" * 5000, 1), "nested deeper than"),
    "a huge number": (lambda d: d.replace(b'"size": 356', b'"size": ' + b"1" * 5000, 1),
                      "a number of 5000 characters"),
    "not UTF-8": (lambda d: d.replace(b"proprietary", b"propri\xe9taire", 1),
                  "not UTF-8 (byte 0xe9"),
}


@pytest.mark.parametrize("case", list(HOSTILE_MANIFESTS))
def test_hostile_manifest_on_a_mirror(arena: Arena, case: str) -> None:
    change, cause = HOSTILE_MANIFESTS[case]
    data = change(_manifest_path(arena).read_bytes())
    _refused(arena, lambda: _publish_manifest(arena, data),
             f"manifest.json from mirror file://{arena.scene.repo}/", cause)


# ------------------------------------------------------------------ a preloaded directory

def _preloaded(arena: Arena) -> Path:
    """The repository copied as an image's preloaded dir (beside the node, not on it)."""
    import shutil

    target = arena.base / "preloaded"
    shutil.copytree(arena.scene.repo, target)
    return target


def _install_preloaded(arena: Arena, preloaded: Path) -> Callable[[], Result]:
    return lambda: install_preloaded(arena, preloaded)


def test_hostile_preloaded_index(arena: Arena) -> None:
    preloaded = _preloaded(arena)
    _refused(arena, lambda: (preloaded / "index.json").write_bytes(
        b'{"schema_version": 1, "packages": [], "aliases": {"x\\u0000": "535"}}'),
        f"index.json from preloaded {preloaded}", "control characters",
        run=_install_preloaded(arena, preloaded))


def test_hostile_preloaded_manifest(arena: Arena) -> None:
    preloaded = _preloaded(arena)
    (preloaded / "index.json").unlink()
    manifest = next(preloaded.glob("*/*/*/manifest.json"))
    _refused(arena, lambda: manifest.write_bytes(b'{"schema_version": -Infinity}'),
             f"manifest.json from {manifest.parent}", "-Infinity is not a JSON number",
             run=_install_preloaded(arena, preloaded))


# ------------------------------------------------------------------ documents on the node

def _installed(arena: Arena) -> None:
    done = install(arena)
    assert done.code == 0, done.stderr[-2000:]


@pytest.mark.parametrize("data", [b'{"kernel_release": "\\ud800"}', b"[" * 200_000,
                                  b'{"package_digest": ["not", "a", "string"]}'])
def test_malformed_state_is_ignored_with_a_warning(arena: Arena, data: bytes) -> None:
    """Chosen: a malformed .state.json is treated as absent (a full run, which rewrites it)
    and a warning names it; it never becomes an internal error."""
    _installed(arena)
    state = arena.install_dir / ".state.json"
    state.write_bytes(data)
    before = arena.snapshot()
    done = install(arena)
    assert done.code == 0, done.stderr[-2000:]
    assert not done.lines and "Traceback" not in done.stderr
    warned = [e for e in done.events if e.get("event") == "install state ignored"]
    assert warned and ".state.json" in str(warned[0]["reason"]), done.events
    assert json.loads(state.read_text())["driver_version"] == VERSION
    assert_untouched(before, arena.snapshot(), (*WORK_AREA, f"node/{_rel(arena)}"))


@pytest.mark.parametrize("name", [".state.json", ".ready.json"])
def test_node_document_that_is_a_directory(arena: Arena, name: str) -> None:
    """Chosen: a directory in place of .state.json or .ready.json could never be rewritten
    (nor is it ours to delete), so the run refuses before it writes (exit 11)."""
    _installed(arena)
    (arena.install_dir / name).unlink()
    (arena.install_dir / name).mkdir()
    (arena.install_dir / name / "x").write_text("{}")
    refused_untouched(arena, lambda: install(arena), 11, name)


def test_state_that_is_a_fifo_does_not_hang(arena: Arena) -> None:
    import os

    _installed(arena)
    (arena.install_dir / ".state.json").unlink()
    os.mkfifo(arena.install_dir / ".state.json")
    before = arena.snapshot()
    done = arena.run("status", *arena.args("--output", "json"), timeout=30)
    assert done.code == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["last_run"] is None
    assert_untouched(before, arena.snapshot(), WORK_AREA)


@pytest.mark.parametrize(("data", "cause"), [
    (b'{"driver_version": "535.261.03", "driver_version": "1"}', "duplicate key"),
    (b'{"gpus": [{"name": "Tesla\\u001b]0;pwned\\u0007"}]}', "control characters"),
    (b"\xc0\xaf", "not UTF-8"),
])
def test_malformed_readiness_is_not_ready_and_says_why(arena: Arena, data: bytes,
                                                       cause: str) -> None:
    """Chosen: a malformed .ready.json means "not ready" (as an absent one does), and
    wait-ready's one line names the document and what is wrong with it (exit 12)."""
    _installed(arena)
    (arena.install_dir / ".ready.json").write_bytes(data)
    before = arena.snapshot()
    done = arena.run("wait-ready", *arena.args("--timeout", "0"))
    assert_refused(done, 12, ".ready.json from ", cause)
    status = arena.run("status", *arena.args("--output", "json"))
    assert status.code == 0, status.stderr[-2000:]
    assert cause in json.loads(status.stdout)["readiness"]["reason"]
    assert_untouched(before, arena.snapshot(), WORK_AREA)


def test_readiness_that_is_a_fifo_does_not_hang(arena: Arena) -> None:
    import os

    _installed(arena)
    (arena.install_dir / ".ready.json").unlink()
    os.mkfifo(arena.install_dir / ".ready.json")
    refused_untouched(arena, lambda: arena.run("wait-ready", *arena.args("--timeout", "0"),
                                               timeout=30),
                      12, ".ready.json at ", "not a regular file")


def test_a_gpu_name_with_a_tab_is_free_text(arena: Arena) -> None:
    _installed(arena)
    ready = arena.install_dir / ".ready.json"
    doc = json.loads(ready.read_text())
    doc["gpus"][0]["name"] = "Tesla\tT4"
    ready.write_text(json.dumps(doc))
    done = arena.run("wait-ready", *arena.args("--timeout", "0"))
    assert done.code == 0, done.stderr[-2000:]


# ------------------------------------------------------------------ the failure line itself

def test_termination_log_that_is_a_directory(arena: Arena) -> None:
    arena.termination_log.mkdir()
    index = arena.scene.repo / "index.json"
    _refused(arena, lambda: index.write_bytes(b'{"a": NaN}'), "index.json", "NaN")
    assert arena.termination_log.is_dir()


def test_termination_log_in_a_missing_directory(arena: Arena) -> None:
    index = arena.scene.repo / "index.json"
    log = arena.scene.work / "missing" / "termination-log"
    _refused(arena, lambda: index.write_bytes(b"[]"), "index.json", "not an object",
             run=lambda: arena.run("install", *arena.args(
                 "--mirror", f"file://{arena.scene.repo}", "--driver-version", VERSION,
                 "--termination-log", str(log))))
    assert not log.parent.exists()


def test_odd_characters_reach_the_line_escaped(arena: Arena) -> None:
    """A value with an escape sequence and an undecodable byte (a surrogate in argv) is
    written to stderr and the termination log as printable text."""
    done = refused_untouched(
        arena, lambda: arena.run("install", *arena.args("--driver-version", "5\x1b[2J\udcff"),
                                 env={"TERMINATION_LOG": str(arena.termination_log)}),
        2, "--driver-version", allowed=())
    assert "\x1b" not in done.stderr
    line = arena.termination_log.read_text(encoding="utf-8")
    assert line.count("\n") == 1 and "\x1b" not in line and "\\x1b" in line


def _rel(arena: Arena) -> str:
    return str(arena.install_dir.relative_to(arena.root)) + "/"
