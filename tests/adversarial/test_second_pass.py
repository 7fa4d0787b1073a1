"""Hardening, second pass: each hostile case through the real CLI, sandboxed.

Every case asserts the exit code, the one line (the problem and the fix), and, from a
listing of the arena before and after, that nothing changed outside the run's own work area.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from e2e import INSTALL_DIR
from httpserver import MirrorServer

from adversarial.harness import (
    VERSION,
    WORK_AREA,
    Arena,
    assert_refused,
    assert_untouched,
    install,
    install_preloaded,
    refused_untouched,
    run_wrapped,
    settle,
)
from adversarial.mirrorkit import (
    CACHE,
    LIB,
    PKG,
    assert_fetched,
    copy_repo,
    edit_manifest,
    fetch,
    fetch_ok,
    fetch_refused,
    good,
    repo_listing,
)

INSTALL = f"/{INSTALL_DIR}"


# ---------------------------------------------------------------- 1. module parameters


SMUGGLING = {
    "value with spaces and =": ("NVreg_X", "$(touch /x) NVreg_Y=1 "
                                "NVreg_RestrictProfilingToAdminUsers=0"),
    "quoted value": ("NVreg_X", '"1"'),
    "name with a space": ("NVreg X", "1"),
}


@pytest.mark.parametrize("case", list(SMUGGLING))
def test_1_package_default_parameter_refused_at_manifest_validation(arena: Arena, case: str
                                                                    ) -> None:
    """Item 1: a default parameter the kernel would split is refused when the manifest is
    validated (exit 7, naming the manifest and the parameter): nothing reaches the cache."""
    key, value = SMUGGLING[case]
    repo = copy_repo(arena, "bad")
    edit_manifest(repo, lambda doc: doc["modules"][0].update(params={key: value}))
    fetch_refused(arena, [f"file://{repo}"], 7, "[fetch]",
                  f"manifest.json from mirror file://{repo}/{PKG}", "modules[0].params",
                  f"default parameter nvidia.{key}", "fix: rebuild")


# ---------------------------------------------------------------- 2. linked directory


def test_2_symlinked_directory_in_a_preloaded_package(arena: Arena) -> None:
    """Item 2: `<pkg>/lib64 -> /elsewhere` in a preloaded tree is refused like a linked
    file (exit 7), even when the files there hash right."""
    preloaded = arena.base / "preloaded"
    shutil.copytree(arena.scene.repo, preloaded)
    elsewhere = arena.base / "elsewhere"
    elsewhere.mkdir()
    shutil.move(preloaded / PKG / "lib64", elsewhere / "lib64")
    (preloaded / PKG / "lib64").symlink_to(elsewhere / "lib64")
    settle(arena)
    refused_untouched(arena, lambda: install_preloaded(arena, preloaded), 7,
                      f"preloaded {preloaded}", "lib64/ is a symbolic link",
                      "directories must be real", "fix: replace the link")


# ---------------------------------------------------------------- 3. short file on a mirror


def _shorten(repo: Path) -> tuple[int, int]:
    lib = repo / LIB
    size = lib.stat().st_size
    with lib.open("r+b") as handle:
        handle.truncate(size // 2)
    return size // 2, size


def test_3_file_shorter_than_its_manifest_on_the_only_mirror(
        arena: Arena, http_bad: tuple[MirrorServer, Path]) -> None:
    """Item 3: the mirror's file is N bytes, the manifest says M: the package on that mirror
    is inconsistent (exit 7), never 'answered HTTP 416'."""
    server, repo = http_bad
    short, size = _shorten(repo)
    done = fetch_refused(arena, [server.url], 7, f"mirror {server.url}",
                         f"the mirror's file is {short} bytes", f"the manifest says {size}",
                         "inconsistent", "fix: republish the package", extra=("--allow-http",),
                         prefixes=CACHE)  # the other files arrived verified
    assert "416" not in done.lines[0]


def test_3_short_file_then_a_good_mirror(arena: Arena,
                                         http_bad: tuple[MirrorServer, Path]) -> None:
    """Item 3: the next source is tried, and the package arrives whole from it."""
    server, repo = http_bad
    _shorten(repo)
    done = fetch_ok(arena, [server.url, good(arena)], extra=("--allow-http",))
    assert any(e.get("event") == "file failed on mirror" and "inconsistent" in str(e)
               for e in done.events), done.stderr[-3000:]


# ---------------------------------------------------------------- 4. oversize index


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_4_index_over_the_size_limit_says_regenerate_it(
        arena: Arena, http_bad: tuple[MirrorServer, Path], scheme: str) -> None:
    """Item 4: an index over the limit names the index's own fix (regenerate it)."""
    server, repo = http_bad
    (repo / "index.json").write_bytes(b" " * (17 * 1024**2) + b"{}")
    mirror = server.url if scheme == "http" else f"file://{repo}"
    done = fetch_refused(arena, [mirror], 7, "index.json", "bytes allowed",
                         "fix: regenerate index.json", extra=("--allow-http",))
    assert "republish" not in done.lines[0]


# ---------------------------------------------------------------- 5. long path component


def test_5_manifest_path_component_over_255_bytes(arena: Arena) -> None:
    """Item 5: refused at validation (exit 7), never a 404 blamed on the kernel."""
    name = "lib64/" + "\u00e9" * 128 + ".so"  # 259 bytes in UTF-8, 131 characters
    repo = repo_listing(arena, "bad", name, b"x")
    done = fetch_refused(arena, [f"file://{repo}"], 7, "manifest.json from mirror",
                         "longer than 255 bytes", "fix: rebuild the package")
    assert "publish a package for this kernel" not in done.lines[0]


# ---------------------------------------------------------------- 6, 7. settings


def _config_refused(arena: Arena, env: dict[str, str], *causes: str) -> None:
    refused_untouched(arena, lambda: arena.run("install", *arena.args("--driver-version", VERSION),
                                               env=env),
                      2, "error(config)", *causes, allowed=())


@pytest.mark.parametrize("value", ["1e-9", "3E1", "-5"])
def test_6_number_with_an_exponent_names_the_rule(arena: Arena, value: str) -> None:
    """Item 6: the real rule (plain decimal, no exponent), not just 'positive'."""
    _config_refused(arena, {"DOWNLOAD_READ_TIMEOUT": value},
                    f"DOWNLOAD_READ_TIMEOUT={value!r}", "plain decimals", "no exponent")


@pytest.mark.parametrize("value", ["file://repo", "file://srv/repo", "file://./repo"])
def test_7_relative_file_mirror_needs_an_absolute_path(arena: Arena, value: str) -> None:
    """Item 7: a file:// mirror is refused for what it lacks: an absolute path."""
    _config_refused(arena, {"DRIVER_MIRRORS": value}, "DRIVER_MIRRORS=",
                    "a file:// mirror needs an absolute path", "file:///srv/repo")


# ---------------------------------------------------------------- 8. install dir is a file


@pytest.mark.parametrize("which", ["install dir", "its parent"])
def test_8_install_dir_that_is_a_file(arena: Arena, which: str) -> None:
    """Item 8: the line says the install dir (or the directory above it) is a file."""
    settle(arena)
    path = arena.install_dir if which == "install dir" else arena.install_dir.parent
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory\n")
    node = "/" + str(path.relative_to(arena.root))
    what = "is a file" if which == "install dir" else f"cannot be created: {node} is a file"
    done = refused_untouched(arena, lambda: install(arena), 2,
                             f"--install-dir {INSTALL} {what}", "fix: remove or rename",
                             allowed=())
    assert "lock" not in done.lines[0]


# ---------------------------------------------------------------- 9. full filesystem

CACHE_NODE = "/var/cache/gni"
# After the run, list what is left on the small tmpfs (it vanishes with the namespace).
TMPFS = """
size=$1; where=$2; listing=$3; shift 3
mount -t tmpfs -o size="$size" tmpfs "$where" || exit 96
"$@"; rc=$?
find "$where" -type f -exec sha256sum {} + > "$listing"
exit $rc
"""


def _preloaded_tarball(arena: Arena) -> list[str]:
    """The package as a preloaded tarball: unpacked into the cache's temp area."""
    from installer.packages.builder.publish import write_tarball

    preloaded = arena.base / "preloaded"
    write_tarball(arena.scene.repo / PKG, preloaded / f"{PKG}.tar.gz")
    return ["--preloaded-dir", str(preloaded)]


@pytest.mark.parametrize("source", ["mirror download", "preloaded tarball"])
def test_9_cache_dir_filesystem_full(arena: Arena, source: str) -> None:
    """Item 9: --cache-dir on a 16 KiB tmpfs: exit 11 naming the path, the bytes needed and
    free; nothing half-written is left on that filesystem (whole verified blobs may be)."""
    cache = arena.root / CACHE_NODE.lstrip("/")
    cache.mkdir(parents=True)
    lib_size = (arena.scene.repo / LIB).stat().st_size
    assert lib_size > 16 * 1024, "the case needs a file larger than the tmpfs"
    flags = (["--mirror", good(arena)] if source == "mirror download"
             else _preloaded_tarball(arena))
    listing = arena.scene.work / "left.txt"
    settle(arena)
    before = arena.snapshot()
    done = run_wrapped(arena, TMPFS, ["16k", str(cache), str(listing)], "fetch",
                        *arena.args(*flags, "--driver-version", VERSION,
                                    "--cache-dir", CACHE_NODE))
    assert_refused(done, 11, "error(staging-failed)", "disk full writing",
                   f"{cache}/tmp/run-", "bytes needed", "free)", "nothing half-written",
                   "fix: free")
    assert "Errno" not in done.lines[0]
    for line in listing.read_text().splitlines():  # only whole blobs named by their hash
        digest, path = line.split(maxsplit=1)
        assert path.startswith(f"{cache}/blobs/sha256/") and path.endswith(digest), line
    assert_untouched(before, arena.snapshot(), WORK_AREA)


# ---------------------------------------------------------------- 10. damaged cache, offline


def test_10_damaged_cached_package_offline(arena: Arena) -> None:
    """Item 10: the fix says the cache was repaired and a source is needed to fetch the
    package again, not 'publish a package'."""
    assert_fetched(fetch(arena, good(arena), extra=("--driver-version", VERSION)))
    blobs = sorted((arena.install_dir / ".cache" / "blobs").rglob("*"))
    blob = max((p for p in blobs if p.is_file()), key=lambda p: p.stat().st_size)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    before = arena.snapshot()
    done = arena.run("fetch", *arena.args("--driver-version", VERSION))
    assert_refused(done, 5, "no longer held", "intact", "the cache was repaired",
                   "fix: give a source that holds the package", "--mirror", "fetched again")
    assert "publish a package" not in done.lines[0]
    assert not blob.exists()
    rel = str(blob.relative_to(arena.base))
    assert_untouched(before, arena.snapshot(), (*WORK_AREA, rel))


# ---------------------------------------------------------------- overlapping dirs


OVERLAPS = {
    "the same directory": (INSTALL, INSTALL, "is the install dir"),
    "install dir inside the cache dir": ("/opt/gni/nvidia", "/opt/gni", "holds the install dir"),
    "cache dir in lib64/": (INSTALL, f"{INSTALL}/lib64/cache", "lies in lib64/"),
    "cache dir in bin/": (INSTALL, f"{INSTALL}/bin", "lies in bin/"),
    "cache dir in a version directory": (INSTALL, f"{INSTALL}/.versions/x/cache",
                                         "lies in .versions/"),
}


@pytest.mark.parametrize("case", list(OVERLAPS))
def test_overlapping_install_and_cache_dirs_are_refused(arena: Arena, case: str) -> None:
    """A cache dir the installer would switch, prune or remove, or one holding the
    install dir, is refused at start (exit 2)."""
    install_dir, cache_dir, why = OVERLAPS[case]
    settle(arena)
    refused_untouched(arena, lambda: install(arena, "--install-dir", install_dir,
                                             "--cache-dir", cache_dir),
                      2, f"--cache-dir {cache_dir} {why}", f"--install-dir {install_dir}",
                      "fix: leave --cache-dir", allowed=())


def test_the_default_cache_dir_given_explicitly_still_installs(arena: Arena) -> None:
    """The documented default, `<install dir>/.cache`, spelled out, is no overlap."""
    done = install(arena, "--cache-dir", f"{INSTALL}/.cache")
    assert done.code == 0, done.stderr[-3000:]
    assert json.loads((arena.install_dir / ".ready.json").read_text())
    assert os.listdir(arena.install_dir / ".cache" / "blobs")
