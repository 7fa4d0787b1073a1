"""Hostile input to `prepare --kernel RELEASE`, through the real CLI, sandboxed.

A release names a directory (/lib/modules/<release>) and a cache path: one that is not a
kernel release string (path characters, empty, huge, control characters) is refused with
exit 2 before anything is read or written; a cache filesystem without room for the
package is refused with exit 11 before anything is written. Each case: the exit code, the
one line naming the cause, `-o json` one object, nothing changed in the arena.
"""

from __future__ import annotations

import json

import pytest

from adversarial.harness import (
    VERSION,
    Arena,
    assert_refused,
    assert_untouched,
    refused_untouched,
    run_wrapped,
    settle,
)

NEXT = "5.15.0-1050-gke"
BAD_RELEASES = {
    "climbs out": "../x",
    "a path": "5.15.0/../../etc",
    "empty": "",
    "dot-dot": "..",
    "option-like": "-rf",
    "huge": "5" * 5000,
    "control characters": "5.15.0\x1b[2J\nerror(fake): ok",
    "space": "5.15.0 1050",
}


def _prepare(arena: Arena, kernel: str, *extra: str) -> list[str]:
    return ["prepare", f"--kernel={kernel}", *arena.args(
        "--mirror", f"file://{arena.scene.repo}", "--driver-version", VERSION, *extra)]


@pytest.mark.parametrize("case", list(BAD_RELEASES))
def test_bad_release_exit_2_nothing_written(arena: Arena, case: str) -> None:
    settle(arena)
    done = refused_untouched(arena, lambda: arena.run(*_prepare(arena, BAD_RELEASES[case])),
                             2, "error(config): --kernel ", "is not a kernel release",
                             "fix: pass the release as `uname -r` prints it", allowed=())
    assert len(done.lines[0]) < 400, "the value is quoted bounded"
    assert "\x1b" not in done.stderr


@pytest.mark.parametrize("case", ["huge", "climbs out"])
def test_bad_release_json_is_one_failed_object(arena: Arena, case: str) -> None:
    settle(arena)
    done = refused_untouched(arena, lambda: arena.run(*_prepare(
        arena, BAD_RELEASES[case], "-o", "json")), 2, "is not a kernel release", allowed=())
    got = json.loads(done.stdout)
    assert got["state"] == "failed" and got["error"] == done.lines[0]
    assert got["arch"] is None and got["digest"] is None and len(got["kernel"]) <= 200


def test_missing_kernel_flag(arena: Arena) -> None:
    settle(arena)
    refused_untouched(arena, lambda: arena.run("prepare", *arena.args()), 2,
                      "--kernel missing is not a kernel release", allowed=())


TMPFS = """
size=$1; where=$2; listing=$3; shift 3
mount -t tmpfs -o size="$size" tmpfs "$where" || exit 96
"$@"; rc=$?
find "$where" -mindepth 1 > "$listing"
exit $rc
"""
CACHE_NODE = "/var/cache/gni"


def test_cache_without_room_exit_11_nothing_written(arena: Arena) -> None:
    """The cache on a 16 KiB tmpfs: refused before the lock, the download or the build."""
    (arena.root / "lib/modules" / NEXT).mkdir(parents=True)
    cache = arena.root / CACHE_NODE.lstrip("/")
    cache.mkdir(parents=True)
    listing = arena.scene.work / "left.txt"
    settle(arena)
    before = arena.snapshot()
    done = run_wrapped(arena, TMPFS, ["16k", str(cache), str(listing)],
                       *_prepare(arena, NEXT, "--cache-dir", CACHE_NODE, "-o", "json"))
    assert_refused(done, 11, "error(staging-failed): [space] not enough space in the cache",
                   f"{cache} for the package of kernel {NEXT}", "bytes needed",
                   "nothing written", "fix: free at least")
    assert listing.read_text() == "", "nothing on the cache's filesystem"
    got = json.loads(done.stdout)
    assert got["state"] == "failed" and got["arch"] == "x86_64"
    assert_untouched(before, arena.snapshot())
