"""Writes by directory descriptor: a link swapped into the path after it was resolved.

The installer resolves a node path under the host root (confine), then writes. If, in
between, a directory on the way is replaced by a symbolic link leading out of the host root,
a write by path follows it out. The install dir's switch (`replace_symlink`) and the cache's
rename (`rename_confined`) open the directory again with openat2(RESOLVE_IN_ROOT) and write
through that descriptor: the write lands inside the root or is refused, never outside.
The swap is made deterministically between the two steps (no race).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from installer.node import confine, host
from installer.node.host import Roots, rename_confined, replace_symlink, write_atomic
from installer.packages.cache import Cache, CacheError

INSTALL = "home/kubernetes/bin/nvidia"


def _scene(tmp_path: Path) -> tuple[Roots, Path, Path]:
    """A host root with the install dir, and the same path outside it (where an escaped
    write would land); returns the roots, the install dir and its outside twin."""
    root = tmp_path / "root"
    (root / INSTALL).mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / INSTALL.removeprefix("home/")).mkdir(parents=True)
    return Roots(root, root / "proc", root / "sys", root / "dev"), root / INSTALL, outside


def _swap_home_for_escape(root: Path) -> None:
    """`home` becomes a relative link climbing out of the root: `../outside` from it."""
    os.rename(root / "home", root / "home.real")
    (root / "home").symlink_to("../outside")


@pytest.fixture(autouse=True)
def _kernel_confines() -> None:
    if not confine.kernel_confines():
        pytest.fail("openat2 is unavailable on this kernel: the *at() writes are not tested")


def test_switch_after_swap_is_refused_not_written_outside(tmp_path: Path) -> None:
    roots, _, outside = _scene(tmp_path)
    link = roots.entry(roots.host / INSTALL / ".current")  # resolved: inside the root
    _swap_home_for_escape(roots.host)
    with pytest.raises(FileNotFoundError):  # `../outside` clamped at the root: not there
        replace_symlink(link, ".versions/v2")
    assert not (outside / "kubernetes/bin/nvidia/.current").exists()
    assert list(outside.rglob(".*")) == []


def test_switch_after_swap_lands_inside_when_the_link_leads_there(tmp_path: Path) -> None:
    """An absolute link means the node's `/`: re-rooted, the write stays in the root."""
    roots, _, outside = _scene(tmp_path)
    link = roots.entry(roots.host / INSTALL / ".current")
    os.rename(roots.host / "home", roots.host / "home.real")
    (roots.host / "home").symlink_to("/home.real")  # on the node: fine, inside
    replace_symlink(link, ".versions/v2")
    assert os.readlink(roots.host / "home.real/kubernetes/bin/nvidia/.current") == \
        ".versions/v2"
    assert not (outside / "kubernetes/bin/nvidia/.current").exists()


def test_state_file_after_swap_is_refused_not_written_outside(tmp_path: Path) -> None:
    """`.state.json`, `.ready.json` and the like (write_atomic) are made the same way."""
    roots, _, outside = _scene(tmp_path)
    path = roots.entry(roots.host / INSTALL / ".ready.json")
    _swap_home_for_escape(roots.host)
    with pytest.raises(FileNotFoundError):
        write_atomic(path, b"{}")
    assert [p for p in outside.rglob("*") if p.is_file()] == []
    os.unlink(roots.host / "home")
    os.rename(roots.host / "home.real", roots.host / "home")
    write_atomic(path, b'{"ready": true}', mode=0o640)  # the path back: written, inside
    assert path.read_bytes() == b'{"ready": true}' and path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in path.parent.iterdir()) == [".ready.json"]


def test_by_path_the_same_swap_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    """The fallback where openat2 is missing (kernels before 5.6) writes by path: the swap
    then carries it outside. What the descriptor closes (and docs/security.md says)."""
    roots, _, outside = _scene(tmp_path)
    link = roots.entry(roots.host / INSTALL / ".current")
    _swap_home_for_escape(roots.host)
    monkeypatch.setattr(confine, "_openat2_works", False)
    monkeypatch.setattr(host, "_by_path_noted", False)
    with capture_logs() as logs:
        replace_symlink(link, ".versions/v2")
        replace_symlink(link, ".versions/v3")
    assert os.readlink(outside / "kubernetes/bin/nvidia/.current") == ".versions/v3"
    noted = [e for e in logs if "openat2 unavailable" in e["event"]]
    assert len(noted) == 1 and noted[0]["log_level"] == "warning"  # once, not per write


def test_cache_rename_after_swap_stays_inside(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The blob is committed by rename; the cache's path is swapped just before it."""
    roots, install, outside = _scene(tmp_path)
    cache = Cache(roots.entry(install / ".cache"))
    data = b"a verified blob"
    sha = hashlib.sha256(data).hexdigest()
    (outside / "kubernetes/bin/nvidia/.cache/blobs/sha256" / sha[:2]).mkdir(parents=True)

    def swap_then_rename(source: Path, target: Path) -> None:
        _swap_home_for_escape(roots.host)
        rename_confined(source, target)

    import installer.packages.cache as cache_module

    monkeypatch.setattr(cache_module, "rename_confined", swap_then_rename)
    with cache.run():
        tmp = cache.temp_path("blob")
        tmp.write_bytes(data)
        with pytest.raises(CacheError):
            cache.commit(tmp, sha)
    assert [p for p in outside.rglob("*") if p.is_file()] == []


def test_rename_within_the_root_goes_through(tmp_path: Path) -> None:
    roots, install, _ = _scene(tmp_path)
    roots.entry(install / "x")  # the root is known to this process
    (install / "a").write_text("new")
    (install / "b").write_text("old")
    rename_confined(install / "a", install / "b")
    assert (install / "b").read_text() == "new" and not (install / "a").exists()
    (install / "sub").mkdir()
    rename_confined(install / "b", install / "sub" / "c")
    assert (install / "sub" / "c").read_text() == "new"


def test_a_host_root_made_anew_at_its_path_is_opened_anew(tmp_path: Path) -> None:
    """The root's descriptor is kept open; a root replaced at the same path (a test's node
    rebuilt) is opened again rather than written through the old, deleted one."""
    roots, install, _ = _scene(tmp_path)
    replace_symlink(roots.entry(install / ".current"), ".versions/a")
    shutil.rmtree(roots.host)
    install.mkdir(parents=True)
    replace_symlink(install / ".current", ".versions/b")
    assert os.readlink(install / ".current") == ".versions/b"
