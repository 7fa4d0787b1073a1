"""file:// mirrors: percent-encoded paths, symlinks and FIFOs cannot climb out of the
mirror's tree or block the run."""

from __future__ import annotations

import hashlib
import os

import pytest

from adversarial.harness import Arena
from adversarial.mirrorkit import (
    PKG,
    add_file,
    assert_fetched,
    copy_repo,
    edit_manifest,
    fetch,
    fetch_refused,
    good,
    warned,
)


@pytest.mark.parametrize("base", ["{repo}/%2e%2e/outside", "{repo}/..%2foutside",
                                  "{repo}%00/x", "{repo}/%2E%2E"])
def test_a_file_mirror_base_with_encoded_traversal_is_refused(arena: Arena, base: str) -> None:
    fetch_refused(arena, ["file://" + base.format(repo=arena.scene.repo)], 7, "is refused")


@pytest.mark.parametrize("path", [
    "lib64/%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2foutside%2fetc%2fsentinel.conf",
    "lib64/%2E%2E/%2E%2E/%2E%2E/%2E%2E/%2E%2E/outside/etc/sentinel.conf",
    "lib64/sentinel%00.conf",
])
def test_a_manifest_path_that_decodes_out_of_the_mirror_is_refused(arena: Arena,
                                                                   path: str) -> None:
    repo = copy_repo(arena, "hostile")
    sentinel = (arena.outside / "etc" / "sentinel.conf").read_bytes()
    edit_manifest(repo, lambda doc: add_file(doc, path, sentinel))
    fetch_refused(arena, [f"file://{repo}"], 7, "is refused", path[:40])


def test_a_hostile_manifest_path_on_the_first_mirror_falls_through(arena: Arena) -> None:
    repo = copy_repo(arena, "hostile")
    sentinel = (arena.outside / "etc" / "sentinel.conf").read_bytes()
    edit_manifest(repo, lambda doc: add_file(
        doc, "lib64/%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2foutside%2fetc%2fsentinel.conf",
        sentinel))
    done = fetch(arena, f"file://{repo}", good(arena))
    assert_fetched(done)
    assert warned(done, "is refused")
    blobs = arena.install_dir / ".cache" / "blobs"
    digest = hashlib.sha256(sentinel).hexdigest()
    assert not list(blobs.rglob(digest)), "a file from outside the mirror entered the cache"


def test_a_symlink_out_of_a_file_mirror_is_refused(arena: Arena) -> None:
    repo = copy_repo(arena, "linked")
    sentinel = arena.outside / "etc" / "sentinel.conf"
    edit_manifest(repo, lambda doc: add_file(doc, "lib64/sentinel.conf", sentinel.read_bytes()))
    (repo / PKG / "lib64" / "sentinel.conf").symlink_to(sentinel)
    fetch_refused(arena, [f"file://{repo}"], 7, "outside the mirror root", "lib64/sentinel.conf")


def test_a_fifo_in_a_file_mirror_cannot_block_the_run(arena: Arena) -> None:
    repo = copy_repo(arena, "fifo")
    (repo / "index.json").unlink()
    os.mkfifo(repo / "index.json")
    done = fetch(arena, f"file://{repo}", good(arena), timeout=20)
    assert_fetched(done)
    assert warned(done, "not a regular file")
