"""The confinement helper: the kernel's RESOLVE_IN_ROOT and our walk agree, and neither
ever leaves the host root, whatever the links."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.node import confine
from installer.node.confine import EscapeError
from installer.node.host import Roots


def tree(base: Path) -> Path:
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True)
    (base / "outside").mkdir()
    return root


CASES = {  # link (relative to root) -> target; then path -> expected (relative to root)
    "abs": ({"home/kubernetes": "/var/lib/k"}, "home/kubernetes/bin/nvidia",
            "var/lib/k/bin/nvidia"),
    "rel-climb": ({"home/x": "../../../../outside"}, "home/x/y", "outside/y"),
    "dotdot-clamped": ({"etc/up": "/../../.."}, "etc/up/etc", "etc"),
    "chain": ({"a": "b", "b": "/c", "c": "etc"}, "a/ld.so.conf.d", "etc/ld.so.conf.d"),
    "dangling": ({"run": "/mnt/run"}, "run/nvidia", "mnt/run/nvidia"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_and_walk_agree_and_stay_inside(tmp_path: Path, name: str) -> None:
    links, path, expected = CASES[name]
    root = tree(tmp_path)
    for where, target in links.items():
        (root / where).parent.mkdir(parents=True, exist_ok=True)
        (root / where).symlink_to(target)
    parts = list(PurePosixPath(path).parts)
    assert confine.resolve(root, PurePosixPath(path)) == root / expected
    assert confine._walk(root, parts) == root / expected


def test_the_last_component_is_kept_when_asked(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "etc" / "conf").symlink_to("/etc/passwd")
    got = confine.resolve(root, PurePosixPath("etc/conf"), follow_last=False)
    assert got == root / "etc" / "conf"


def test_a_link_loop_is_refused(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    with pytest.raises(EscapeError):
        confine.resolve(root, PurePosixPath("a/x"))
    with pytest.raises(EscapeError):
        confine._walk(root, ["a", "x"])


def test_a_host_root_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(EscapeError) as raised:
        confine.resolve(tmp_path / "file", PurePosixPath("etc"))
    assert raised.value.code == 4


def test_roots_confine_a_symlinked_dev_root(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "dev").symlink_to(tmp_path / "outside")
    roots = Roots(root, root / "proc", root / "sys", root / "dev")
    assert roots.confine(roots.dev) == root / str(tmp_path / "outside").lstrip("/")
    assert roots.entry(root / "dev" / "nvidia0").parent == roots.confine(root / "dev")


NAMES = st.sampled_from(["a", "b", "c", "etc", "..", "."])
TARGETS = st.lists(NAMES, min_size=1, max_size=4).map("/".join)


@settings(max_examples=60, deadline=None)
@given(links=st.dictionaries(st.sampled_from(["a", "b", "c", "etc/x"]),
                             st.tuples(st.booleans(), TARGETS), max_size=4),
       path=st.lists(NAMES, min_size=1, max_size=6))
def test_any_link_graph_stays_inside_and_both_ways_agree(
        links: dict[str, tuple[bool, str]], path: list[str]) -> None:
    base = Path(tempfile.mkdtemp())
    try:
        root = tree(base)
        for where, (absolute, target) in links.items():
            os.symlink(("/" if absolute else "") + target, root / where)
        try:
            walked = confine._walk(root, [p for p in path if p != "."])
        except EscapeError:
            return
        got = confine.resolve(root, PurePosixPath(*path))
        assert got == root or root in got.parents
        assert walked == root or root in walked.parents
        if got.exists():
            assert got == walked
    finally:
        shutil.rmtree(base)
