"""installer.node.inotify: events parsed from the kernel's `struct inotify_event` records,
filtered by name per watched directory; an overflow counts as a change; nothing blocks."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from installer.node import inotify


def record(wd: int, mask: int, name: str = "") -> bytes:
    raw = name.encode()
    raw += b"\0" * (-len(raw) % 16 or 16) if raw else b""
    return struct.pack("iIII", wd, mask, 0, len(raw)) + raw


@pytest.fixture
def watcher() -> inotify.Watcher:
    found = inotify.open_watcher()
    if found is None:
        pytest.skip("no inotify here")
    return found


def test_names_are_filtered_per_directory(tmp_path: Path, watcher: inotify.Watcher) -> None:
    (tmp_path / "run").mkdir()
    assert watcher.watch(tmp_path / "run", lambda name: name.startswith("reboot-required"))
    assert watcher.changed() == []  # nothing queued: returns at once
    (tmp_path / "run/other.pid").write_text("1")
    assert watcher.changed() == []
    (tmp_path / "run/reboot-required").write_text("")
    assert watcher.changed() == [f"{tmp_path / 'run'}/reboot-required"] * 2  # create, close
    watcher.close()
    assert watcher.changed() == [] and not watcher.watch(tmp_path, lambda name: True)


def test_an_overflow_is_a_change(watcher: inotify.Watcher) -> None:
    data = record(-1, inotify.IN_Q_OVERFLOW) + record(99, inotify.IN_CREATE, "unknown-wd")
    assert watcher._parse(data) == ["overflow"]
    watcher.close()


def test_a_watched_directory_that_goes_is_said_and_forgotten(
        tmp_path: Path, watcher: inotify.Watcher) -> None:
    (tmp_path / "tree").mkdir()
    assert watcher.watch(tmp_path / "tree", lambda name: True)
    (tmp_path / "tree").rmdir()
    changes = watcher.changed()
    assert f"{tmp_path / 'tree'} (gone)" in changes
    assert watcher.watched() == []
    watcher.close()


def test_a_link_is_not_watched_through(tmp_path: Path, watcher: inotify.Watcher) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert not watcher.watch(tmp_path / "link", lambda name: True)  # IN_DONT_FOLLOW
    assert not watcher.watch(tmp_path / "absent", lambda name: True)
    watcher.close()
