"""`package index` over symbolic links: a linked package directory (at the kernel, driver or
flavour level), a linked manifest, and a linked receipt (or a directory of receipts) are
refused by name, exit 7, nothing written; a link that leads to no package and has no
receipt is none of the index's business.

The repository is the arena's own (one package, built by `e2e.add_version`), given the
receipt a build farm's shard writes (`package build --shard`), so an untouched copy is
listed; each case then moves part of it out of the repository and links it back.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from adversarial.harness import Arena, Result, assert_ok, assert_refused, assert_untouched

TIMEOUT = 20  # seconds per run: a hang is cut off; a loaded machine still finishes


def _shard_repo(arena: Arena) -> tuple[Path, str]:
    """A copy of the arena's repository as a shard leaves it: the package, its receipt,
    no index.json. Returns the repository and the package's `<kernel>/<driver>/<flavour>`."""
    repo = arena.base / "farm"
    shutil.copytree(arena.scene.repo, repo, symlinks=True)
    (repo / "index.json").unlink()
    manifest = next(repo.glob("*/*/*/manifest.json"))
    relpath = manifest.parent.relative_to(repo).as_posix()
    receipt = repo / ".receipts" / f"{relpath}.sha256"
    receipt.parent.mkdir(parents=True)
    receipt.write_text(hashlib.sha256(manifest.read_bytes()).hexdigest() + "\n")
    return repo, relpath


def _index(arena: Arena, repo: Path) -> Result:
    return arena.run("package", "index", str(repo), "--output", "json", timeout=TIMEOUT)


def _move_out(arena: Arena, repo: Path, relpath: str) -> Path:
    """Move `relpath` out of the repository (under outside/) and link it back."""
    inside, outside = repo / relpath, arena.outside / "elsewhere" / relpath
    outside.parent.mkdir(parents=True, exist_ok=True)
    inside.rename(outside)
    inside.symlink_to(outside)
    return outside


def test_the_untouched_repository_is_listed(arena: Arena) -> None:
    repo, relpath = _shard_repo(arena)
    done = _index(arena, repo)
    assert_ok(done)
    assert json.loads(done.stdout)["packages"] == [relpath]


LINKED = {"kernel directory": 1, "driver directory": 2, "flavour (package) directory": 3}


@pytest.mark.parametrize("level", LINKED)
def test_a_linked_package_directory_is_refused_by_name(arena: Arena, level: str) -> None:
    repo, relpath = _shard_repo(arena)
    linked = "/".join(relpath.split("/")[:LINKED[level]])
    _move_out(arena, repo, linked)
    before = arena.snapshot()
    done = _index(arena, repo)
    assert_refused(done, 7, f"{linked} in repository {repo} is a symbolic link",
                   "lists only packages and receipts stored in the repository",
                   f"replace the link {linked}")
    assert_untouched(before, arena.snapshot())
    assert not (repo / "index.json").exists()


@pytest.mark.parametrize("level", LINKED)
def test_a_dangling_linked_package_with_a_receipt_is_refused(arena: Arena, level: str) -> None:
    """The package the receipt names is a link to nothing: not skipped as '0 packages'."""
    repo, relpath = _shard_repo(arena)
    linked = "/".join(relpath.split("/")[:LINKED[level]])
    shutil.rmtree(_move_out(arena, repo, linked))
    before = arena.snapshot()
    assert_refused(_index(arena, repo), 7, f"{linked} in repository {repo} is a symbolic link")
    assert_untouched(before, arena.snapshot())


def test_a_linked_manifest_is_refused(arena: Arena) -> None:
    repo, relpath = _shard_repo(arena)
    _move_out(arena, repo, f"{relpath}/manifest.json")
    before = arena.snapshot()
    assert_refused(_index(arena, repo), 7,
                   f"{relpath}/manifest.json in repository {repo} is a symbolic link")
    assert_untouched(before, arena.snapshot())


@pytest.mark.parametrize("part", ["receipt", "receipts directory", "receipts of a kernel"])
def test_a_linked_receipt_is_refused(arena: Arena, part: str) -> None:
    repo, relpath = _shard_repo(arena)
    linked = {"receipt": f".receipts/{relpath}.sha256", "receipts directory": ".receipts",
              "receipts of a kernel": f".receipts/{relpath.split('/')[0]}"}[part]
    _move_out(arena, repo, linked)
    before = arena.snapshot()
    assert_refused(_index(arena, repo), 7, f"{linked} in repository {repo} is a symbolic link")
    assert_untouched(before, arena.snapshot())


def test_a_link_to_no_package_is_left_alone(arena: Arena) -> None:
    """A link beside the packages that leads to none (docs, a mirror's README) is no
    package: the index is written as without it."""
    repo, relpath = _shard_repo(arena)
    (arena.outside / "docs").mkdir()
    (repo / "docs").symlink_to(arena.outside / "docs")
    done = _index(arena, repo)
    assert_ok(done)
    assert json.loads(done.stdout)["packages"] == [relpath]
