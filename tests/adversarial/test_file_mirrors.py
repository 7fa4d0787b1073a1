"""file:// mirrors: percent-encoded paths, symlinks and FIFOs cannot climb out of the
mirror's tree or block the run."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from adversarial.harness import Arena
from adversarial.mirrorkit import (
    PKG,
    assert_fetched,
    copy_repo,
    fetch,
    fetch_refused,
    good,
    repo_listing,
    warned,
)


@pytest.mark.parametrize("base", ["{repo}/%2e%2e/outside", "{repo}/..%2foutside",
                                  "{repo}%00/x", "{repo}/%2E%2E"])
def test_a_file_mirror_base_with_encoded_traversal_is_refused(arena: Arena, base: str) -> None:
    fetch_refused(arena, ["file://" + base.format(repo=arena.scene.repo)], 7, "is refused")


ENCODED_ESCAPE = "lib64/" + "%2e%2e%2f" * 5 + "outside%2fetc%2fsentinel.conf"


def sentinel(arena: Arena) -> Path:
    """A file outside the mirror (on this container's own filesystem, as the arena has it)."""
    return arena.outside / "etc" / "sentinel.conf"


@pytest.mark.parametrize("path", [
    ENCODED_ESCAPE,
    "lib64/%2E%2E/%2E%2E/%2E%2E/%2E%2E/%2E%2E/outside/etc/sentinel.conf",
    "lib64/sentinel%00.conf",
])
def test_a_manifest_path_that_decodes_out_of_the_mirror_is_refused(arena: Arena,
                                                                   path: str) -> None:
    repo = repo_listing(arena, "hostile", path, sentinel(arena).read_bytes())
    fetch_refused(arena, [f"file://{repo}"], 7, "is refused", path[:40])


def test_a_hostile_manifest_path_on_the_first_mirror_falls_through(arena: Arena) -> None:
    data = sentinel(arena).read_bytes()
    repo = repo_listing(arena, "hostile", ENCODED_ESCAPE, data)
    done = fetch(arena, f"file://{repo}", good(arena))
    assert_fetched(done)
    assert warned(done, "is refused")
    blobs = arena.install_dir / ".cache" / "blobs"
    digest = hashlib.sha256(data).hexdigest()
    assert not list(blobs.rglob(digest)), "a file from outside the mirror entered the cache"


def test_a_symlink_out_of_a_file_mirror_is_refused(arena: Arena) -> None:
    outside = sentinel(arena)
    repo = repo_listing(arena, "linked", "lib64/sentinel.conf", outside.read_bytes())
    (repo / PKG / "lib64" / "sentinel.conf").symlink_to(outside)
    fetch_refused(arena, [f"file://{repo}"], 7, "outside the mirror root", "lib64/sentinel.conf")


def test_a_fifo_in_a_file_mirror_cannot_block_the_run(arena: Arena) -> None:
    repo = copy_repo(arena, "fifo")
    (repo / "index.json").unlink()
    os.mkfifo(repo / "index.json")
    done = fetch(arena, f"file://{repo}", good(arena), timeout=20)
    assert_fetched(done)
    assert warned(done, "not a regular file")
