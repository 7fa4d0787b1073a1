"""The compile cache's key: it changes when anything that shapes a compile's bytes changes
(sources, headers, release, arch, flavour, modules, compiler, patches, the compile code), and
only then; inputs without a digest are not cached. The CLI end of it: test_compile_cache.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from installer.packages.builder import compilecache

SHA = "ab" * 32
PARTS: dict[str, Any] = {
    "source_sha256": SHA, "version": "535.261.03", "flavour": "proprietary",
    "headers": [{"name": "linux-headers-6.1.0-57-amd64", "version": "6.1.245-1", "sha256": SHA}],
    "release": "6.1.0-57-amd64", "arch": "x86_64",
    "modules": ["nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"],
    "compiler": "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0", "patches": [],
}
CHANGED: dict[str, Any] = {
    "source_sha256": "cd" * 32, "version": "535.261.04", "flavour": "open",
    "headers": [dict(PARTS["headers"][0], sha256="cd" * 32)], "release": "6.1.0-58-amd64",
    "arch": "aarch64", "modules": ["nvidia"], "compiler": "gcc-12 (Debian 12.2.0-15) 12.2.0",
    "patches": ["ef" * 32],
}
BUILDER = Path(compilecache.__file__).parent


def test_the_key_is_stable_for_the_same_inputs() -> None:
    assert compilecache.compile_key(dict(PARTS)) == compilecache.compile_key(dict(PARTS))


@pytest.mark.parametrize("part", sorted(CHANGED))
def test_every_input_changes_the_key(part: str) -> None:
    assert compilecache.compile_key({**PARTS, part: CHANGED[part]}) != \
        compilecache.compile_key(PARTS)


def test_the_compile_code_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = compilecache.compile_key(PARTS)
    monkeypatch.setattr(compilecache, "code_digest", lambda: "0" * 64)
    assert compilecache.compile_key(PARTS) != before


@pytest.mark.parametrize("missing", [
    {"source_sha256": ""}, {"compiler": None}, {"headers": []},
    {"headers": [dict(PARTS["headers"][0], sha256="")]},
])
def test_inputs_without_a_digest_are_not_cached(missing: dict[str, Any]) -> None:
    assert compilecache.compile_key({**PARTS, **missing}) is None


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "builder"
    shutil.copytree(BUILDER, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.parametrize("name", compilecache.COMPILE_CODE)
def test_code_that_shapes_the_make_run_is_in_the_digest(name: str, tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    before = compilecache.code_digest(folder=copy)
    with (copy / name).open("a") as file:
        file.write("# changed\n")
    assert compilecache.code_digest(folder=copy) != before


def test_the_rest_of_the_build_code_is_not(tmp_path: Path) -> None:
    """Writing, signing and publishing packages re-package from the cache: no compile."""
    copy = _copy(tmp_path)
    before = compilecache.code_digest(folder=copy)
    others = sorted(p for p in copy.glob("*.py") if p.name not in compilecache.COMPILE_CODE)
    assert {p.name for p in others} >= {"publish.py", "signing.py", "matrix.py", "inputs.py"}
    for path in others:
        with path.open("a") as file:
            file.write("# changed\n")
    assert compilecache.code_digest(folder=copy) == before


def test_the_digest_is_of_the_running_code() -> None:
    assert compilecache.code_digest() == compilecache.code_digest(folder=BUILDER)
