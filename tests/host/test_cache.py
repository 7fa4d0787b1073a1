"""The content-addressed cache (packages.cache) and progress reporting (stages.fetch.progress)."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from installer.packages.cache import Cache
from installer.packages.manifest import FileEntry, Manifest, dump_manifest, parse_manifest
from installer.stages.fetch.progress import Progress


def entry(data: bytes, path: str = "lib64/a.so") -> FileEntry:
    return FileEntry(path, len(data), hashlib.sha256(data).hexdigest(), 0o644, "library")


def manifest(version: str, *entries: FileEntry) -> tuple[Manifest, bytes]:
    m = Manifest(1, version, "6.1.0-26-cloud-amd64", "x86_64", "open", None, entries, ())
    return m, dump_manifest(m)


def stored(cache: Cache, data: bytes, path: str = "lib64/a.so") -> FileEntry:
    e = entry(data, path)
    assert cache.ingest(io.BytesIO(data), e)
    return e


class TestStore:
    def test_enters_only_when_hash_matches(self, tmp_path: Path) -> None:
        cache = Cache(tmp_path / "cache")
        with cache.run() as run_dir:
            good = entry(b"abc")
            assert not cache.ingest(io.BytesIO(b"abd"), good)
            assert not cache.has_blob(good)
            assert list(run_dir.iterdir()) == []
            assert cache.ingest(io.BytesIO(b"abc"), good)
            assert cache.blob(good.sha256).read_bytes() == b"abc"

    def test_shared_files_stored_once(self, tmp_path: Path) -> None:
        cache = Cache(tmp_path / "cache")
        with cache.run():
            shared = stored(cache, b"same bytes", "lib64/libcuda.so.535.261.03")
            cache.record(*manifest("535.261.03", shared), requested="535")
            again = stored(cache, b"same bytes", "lib64/libcuda.so.535.54.03")
            cache.record(*manifest("535.54.03", again), requested="535.54.03")
        blobs = [p for p in (tmp_path / "cache" / "blobs").rglob("*") if p.is_file()]
        assert len(blobs) == 3  # one file, two manifests

    def test_damaged_blob_detected(self, tmp_path: Path) -> None:
        cache = Cache(tmp_path / "cache")
        with cache.run():
            e = stored(cache, b"0123456789")
        blob = cache.blob(e.sha256)
        blob.chmod(0o644)
        blob.write_bytes(b"0123456780")
        assert cache.missing((e,)) == [e]
        assert not blob.exists()


class TestRuns:
    def test_dead_run_removed_live_run_kept(self, tmp_path: Path) -> None:
        cache = Cache(tmp_path / "cache")
        tmp = tmp_path / "cache" / "tmp"
        (tmp / "run-1-dead").mkdir(parents=True)
        (tmp / "run-1-dead" / "x.part").write_bytes(b"half")
        (tmp / "run-2-live").mkdir()
        with (tmp / "run-2-live.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with cache.run() as mine:
                names = sorted(p.name for p in tmp.iterdir() if p.is_dir())
                assert names == sorted(["run-2-live", mine.name])
        assert not (tmp / "run-1-dead").exists()
        assert not any(p.name.startswith(mine.name) for p in tmp.iterdir())

    def test_sweep_outside_a_run_clears_dead_runs_and_orphan_locks(self, tmp_path: Path) -> None:
        """The fast path opens no run: its sweep must clear a killed download's folder, and a
        lock file whose run died after removing its folder, but nothing a live run holds."""
        cache = Cache(tmp_path / "cache")
        tmp = tmp_path / "cache" / "tmp"
        (tmp / "run-1-dead").mkdir(parents=True)
        (tmp / "run-1-dead" / "runfile.part").write_bytes(b"half")
        (tmp / "run-1-dead.lock").touch()
        (tmp / "run-3-gone.lock").touch()  # killed between removing its folder and its lock
        (tmp / "run-2-live").mkdir()
        (tmp / "unrelated").touch()  # not ours: never removed
        with (tmp / "run-2-live.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cache.sweep()
            assert sorted(p.name for p in tmp.iterdir()) == [
                "run-2-live", "run-2-live.lock", "unrelated"]
        cache.sweep()
        assert sorted(p.name for p in tmp.iterdir()) == ["unrelated"]

    def test_sweep_without_a_cache_writes_nothing(self, tmp_path: Path) -> None:
        Cache(tmp_path / "cache").sweep()
        assert not (tmp_path / "cache").exists()

    def test_a_lock_swept_before_it_was_held_is_given_up(self, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
        """A run whose fresh lock file a concurrent sweep unlinked before its flock takes a
        new name: otherwise its folder would look dead to the next sweep."""
        cache = Cache(tmp_path / "cache")
        tmp = tmp_path / "cache" / "tmp"
        real_flock = fcntl.flock
        swept: list[str] = []

        def flock_after_a_sweep(handle: Any, how: int) -> None:
            if not swept and how == fcntl.LOCK_EX:
                name = Path(handle.name)
                swept.append(name.name)
                name.unlink()  # what a sweep does to an unheld orphan lock
            real_flock(handle, how)

        monkeypatch.setattr(fcntl, "flock", flock_after_a_sweep)
        with cache.run() as mine:
            assert f"{mine.name}.lock" != swept[0]
            assert (tmp / f"{mine.name}.lock").is_file()


class TestPrune:
    def test_keeps_recent_and_in_use(self, tmp_path: Path) -> None:
        cache = Cache(tmp_path / "cache")
        digests = {}
        with cache.run():
            for version in ("535.54.03", "535.104.05", "535.261.03"):
                e = stored(cache, version.encode() * 100, f"lib64/lib.so.{version}")
                digests[version] = cache.record(*manifest(version, e), requested=version)
            removed = cache.prune(1, {digests["535.54.03"]}, parse_manifest)
        assert removed == [digests["535.104.05"]]
        left = {json.loads(p.read_text())["driver_version"]
                for p in (tmp_path / "cache" / "refs").glob("*.json")}
        assert left == {"535.54.03", "535.261.03"}
        assert not cache.blob(hashlib.sha256(b"535.104.05" * 100).hexdigest()).exists()
        assert cache.blob(hashlib.sha256(b"535.54.03" * 100).hexdigest()).exists()


class Log:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestProgress:
    def test_json_events_are_throttled(self) -> None:
        log = Log()
        progress = Progress(1000, log, stream=io.StringIO(), interval=3600)
        for _ in range(10):
            progress.advance(100)
        assert log.events == []
        eager = Progress(1000, log, stream=io.StringIO(), interval=0)
        eager.advance(250)
        assert log.events[-1]["event"] == "download progress"
        assert (log.events[-1]["bytes"], log.events[-1]["percent"]) == (250, 25.0)

    def test_bar_on_a_terminal(self) -> None:
        stream = FakeTty()
        progress = Progress(2_000_000, Log(), stream=stream)
        progress.advance(1_000_000)
        progress.finish()
        assert " 50.0% 1/2 MB" in stream.getvalue()
        assert stream.getvalue().endswith("\n") and "[###" in stream.getvalue()


@pytest.mark.parametrize("size", [0, 1, 1 << 20])
def test_empty_and_exact_chunk_sizes(tmp_path: Path, size: int) -> None:
    cache = Cache(tmp_path / "cache")
    with cache.run():
        stored(cache, b"z" * size)
