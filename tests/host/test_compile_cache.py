"""`package build --compile-cache DIR`: a compile is kept by what shapes its bytes, and a
build with the same inputs copies the modules instead of running make.

The CLI runs in a subprocess. Sources and headers are the `nvsources` stand-ins packed as
tarballs (inputs with a digest; directories of headers are never cached), and the compiler is
a `gcc-12` wrapper first on PATH that logs every call, so "make ran" is seen in its log, not
in ours. The key's other inputs (compiler version, patches, the compile code) are changed one
at a time; `tests/unit/test_compilecache.py` checks the key itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from nvsources import fake_kbuild, mini_source, refused_build

from installer.packages.manifest import parse_manifest

RELEASE = "6.1.0-57-amd64"
CLI = (sys.executable, "-m", "installer", "package", "build")
WRAPPER = """#!/bin/sh
if [ "$1" = --version ]; then echo "gcc-12 (Debian {version}) 12.2.0"; exit 0; fi
echo "$@" >> {log}
exec {gcc} "$@"
"""


def _tarball(tree: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    return out


class Bench:
    """Inputs, a logging compiler and a cache; `build()` runs the CLI once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.source = _tarball(mini_source(root / "src" / "nvidia-src"), root / "src.tar.gz")
        self.headers = _tarball(fake_kbuild(root / "hdr" / "linux-headers", RELEASE),
                                root / "headers.tar.gz")
        self.cache, self.calls = root / "cache", root / "gcc.log"
        self.bin = root / "bin"
        self.bin.mkdir()
        self.compiler("12.2.0-14+deb12u1")
        self.builds = 0

    def compiler(self, version: str) -> None:
        """`gcc-12` that answers --version with `version` and logs each compile."""
        gcc = shutil.which("gcc-12") or shutil.which("gcc")
        assert gcc, "the host tier needs gcc"
        wrapper = self.bin / "gcc-12"
        wrapper.write_text(WRAPPER.format(version=version, log=self.calls, gcc=gcc))
        wrapper.chmod(0o755)

    def build(self, *extra: str) -> tuple[Path, str]:
        """One build into a fresh out dir: (the package dir, stderr)."""
        self.builds += 1
        out = self.root / f"out{self.builds}"
        done = subprocess.run(
            [*CLI, f"--nvidia-source={self.source}", f"--kernel-headers={self.headers}",
             f"--compile-cache={self.cache}", f"--out-dir={out}", "--jobs=2", *extra],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}"})
        assert done.returncode == 0, done.stderr[-3000:]
        return out, done.stderr

    def compiles(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0

    def entries(self) -> list[Path]:
        return sorted(p for p in self.cache.iterdir() if not p.name.startswith("."))


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    return Bench(tmp_path)


def _modules(package: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((package / "modules").iterdir())}


def test_same_inputs_compile_once_and_package_the_same_bytes(bench: Bench) -> None:
    first, _ = bench.build()
    ran = bench.compiles()
    assert ran == 4  # one gcc call per module
    second, stderr = bench.build()
    assert bench.compiles() == ran, "make ran again for the same inputs"
    assert "compile cache hit" in stderr
    assert _modules(first) == _modules(second)
    assert (first / "manifest.json").read_bytes() == (second / "manifest.json").read_bytes()
    [entry] = bench.entries()
    record = json.loads((entry / "compiled.json").read_text())
    assert sorted(record["modules"]) == sorted(_modules(first))
    assert parse_manifest((second / "manifest.json").read_bytes()).provenance is not None


@pytest.mark.parametrize("change", ["compiler", "patch", "sources", "headers"])
def test_each_input_that_shapes_the_bytes_compiles_again(bench: Bench, change: str) -> None:
    bench.build()
    extra: list[str] = []
    if change == "compiler":
        bench.compiler("12.2.0-14+deb12u2")
    elif change == "patch":
        patch = bench.root / "fix.patch"
        patch.write_text(_patch_for(bench.root / "src" / "nvidia-src"))
        extra.append(f"--patch={patch}")
    elif change == "sources":
        (bench.root / "src" / "nvidia-src" / "extra.h").write_text("/* another file */\n")
        bench.source = _tarball(bench.root / "src" / "nvidia-src", bench.root / "src2.tar.gz")
    else:
        (bench.root / "hdr" / "linux-headers" / "extra.h").write_text("/* another */\n")
        bench.headers = _tarball(bench.root / "hdr" / "linux-headers",
                                 bench.root / "headers2.tar.gz")
    bench.build(*extra)
    assert bench.compiles() == 8, f"a changed {change} did not compile again"
    assert len(bench.entries()) == 2


def _patch_for(tree: Path) -> str:
    """A -p1 patch adding one comment line at the top of the tree's Kbuild."""
    first = (tree / "Kbuild").read_text().splitlines()[0]
    return f"--- a/Kbuild\n+++ b/Kbuild\n@@ -1 +1,2 @@\n+# patched\n {first}\n"


def test_a_damaged_entry_is_compiled_and_written_again(bench: Bench) -> None:
    bench.build()
    [entry] = bench.entries()
    (entry / "nvidia.ko").write_bytes(b"not the module it recorded")
    second, stderr = bench.build()
    assert bench.compiles() == 8 and "compile cache hit" not in stderr
    assert (entry / "nvidia.ko").read_bytes() == (second / "modules" / "nvidia.ko").read_bytes()


def test_headers_without_a_digest_are_not_cached(bench: Bench) -> None:
    bench.headers = bench.root / "hdr" / "linux-headers"  # a directory: no digest
    bench.build()
    bench.build()
    assert bench.compiles() == 8
    assert not bench.cache.exists() or bench.entries() == []


def test_compile_cache_without_headers_is_refused(tmp_path: Path) -> None:
    source = mini_source(tmp_path / "src")
    line = refused_build(tmp_path / "out", f"--nvidia-source={source}",
                         f"--compile-cache={tmp_path / 'cache'}")
    assert "--compile-cache needs --nvidia-source with --kernel-headers" in line
    assert not (tmp_path / "cache").exists()


def test_compile_cache_that_is_a_file_is_refused(bench: Bench) -> None:
    bench.cache.write_text("a file\n")
    line = refused_build(bench.root / "out", f"--nvidia-source={bench.source}",
                         f"--kernel-headers={bench.headers}", f"--compile-cache={bench.cache}")
    assert f"--compile-cache {bench.cache} is not a directory" in line
    assert bench.cache.read_text() == "a file\n"
