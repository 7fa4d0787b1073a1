"""`package build --repo`: the repository is whole between any two steps of a publish.

The kill storm (test_killstorm) hits the instant between a package's swap and its index
update only now and then (it is short); here the swap itself is wrapped, so the states a
SIGKILL could leave just before and just after it are checked every time: before the fix the
index still named the replaced package's digest once its directory held the new one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from killscenes import stand_in_modules
from killstorm import check_repo
from native import build_standins
from native.packages import standin_tree

from installer.node.syscalls import exchange
from installer.packages.builder import BuildRequest, build, publish

VERSION = "535.261.03"
KERNEL = "6.1.0-26-cloud-amd64"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A stand-in user-mode tree and two module sets: same identity, other bytes."""
    base = tmp_path_factory.mktemp("inputs")
    tree = standin_tree(base / "tree", build_standins(base / "built"), VERSION)
    return (tree, stand_in_modules(base / "a", KERNEL, "a"),
            stand_in_modules(base / "b", KERNEL, "b"))


def _publish(repo: Path, tree: Path, modules: Path) -> str:
    return build(BuildRequest(trees=(tree,), modules_dir=modules, repo=repo,
                              aliases=("default",), force=True)).digest


def _listed(repo: Path) -> list[str]:
    index = json.loads((repo / "index.json").read_text())
    return [p["manifest_sha256"] for p in index["packages"]]


def _watch_swap(monkeypatch: pytest.MonkeyPatch, repo: Path
                ) -> list[tuple[str, list[str], list[str]]]:
    """Record check_repo and the digests index.json lists just before and just after every
    swap: the states a SIGKILL there would leave."""
    seen: list[tuple[str, list[str], list[str]]] = []
    real = publish._swap_into_place

    def swap(tmp: Path, destination: Path) -> None:
        seen.append(("before", check_repo(repo), _listed(repo)))
        real(tmp, destination)
        seen.append(("after", check_repo(repo), _listed(repo)))

    monkeypatch.setattr(publish, "_swap_into_place", swap)
    return seen


@pytest.mark.parametrize("contents", ["other", "same"])
def test_the_states_around_the_swap_are_whole(
        tmp_path: Path, inputs: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch,
        contents: str) -> None:
    """Other contents: the old entry is withdrawn first (without that, index.json named the
    old digest while the directory held the new package). The same contents: the entry
    stays listed, and the place is never empty (one exchange)."""
    tree, first, second = inputs
    repo = tmp_path / "repo"
    old = _publish(repo, tree, first)
    seen = _watch_swap(monkeypatch, repo)
    new = _publish(repo, tree, first if contents == "same" else second)
    assert (new == old) is (contents == "same")
    listed = [old] if contents == "same" else []
    assert seen == [("before", [], listed), ("after", [], listed)]
    assert _listed(repo) == [new]
    assert check_repo(repo, quiescent=True) == []


def test_leftovers_of_killed_builds_are_removed(
        tmp_path: Path, inputs: tuple[Path, Path, Path]) -> None:
    """What a SIGKILL leaves (a half-written package dir, an old one, an index temp) goes
    with the next build of that place; nothing else beside it is touched."""
    tree, first, _ = inputs
    repo = tmp_path / "repo"
    _publish(repo, tree, first)
    place = repo / KERNEL / VERSION
    (place / ".open.k1ll3d").mkdir()
    (place / ".open.k1ll3d" / "libcuda.so.1").write_bytes(b"half")
    (place / ".open.old-4242").mkdir()
    (repo / ".index.json.tmp-4242").write_text('{"schema_version": 1, "pack')
    (place / ".proprietary.k1ll3d").mkdir()  # another place's: left to its own builds
    _publish(repo, tree, first)
    left = sorted(p.name for p in [*place.iterdir(), *repo.iterdir()] if p.name[0] == ".")
    assert left == [".index.json.lock", ".open.lock", ".proprietary.k1ll3d"]
    assert check_repo(repo) == []


def test_exchange_swaps_two_directories(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
        (directory / "name").write_text(directory.name)
    assert exchange(first, second) is True  # this machine's kernel and filesystem can
    assert (first / "name").read_text() == "second"
    assert (second / "name").read_text() == "first"
    with pytest.raises(FileNotFoundError):
        exchange(first, tmp_path / "missing")
    assert os.listdir(first) == ["name"]
