"""The node lock between real processes: waits, names the holder, survives SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from installer.errors import LockHeldError
from installer.installdir.state import InstallState, clear_state, read_state, write_state
from installer.node.lock import holder_pid, node_lock

HOLDER = """
import sys, time
from pathlib import Path
from installer.node.lock import node_lock
with node_lock(Path(sys.argv[1]), timeout=5):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _hold(path: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


class TestNodeLock:
    def test_held_lock_fails_with_holder_pid(self, tmp_path: Path) -> None:
        lock = tmp_path / "install" / ".lock"
        proc = _hold(lock, 30)
        try:
            with pytest.raises(LockHeldError) as info, node_lock(lock, timeout=0.3):
                pass
            assert f"PID {proc.pid}" in info.value.message and info.value.code == 13
        finally:
            proc.kill()
            proc.wait()

    def test_waits_for_release(self, tmp_path: Path) -> None:
        lock = tmp_path / ".lock"
        proc = _hold(lock, 0.5)
        waited: list[int | None] = []
        with node_lock(lock, timeout=20, on_wait=waited.append):
            assert holder_pid(lock) is not None
        proc.wait()
        assert waited == [proc.pid]

    def test_sigkilled_holder_releases_lock(self, tmp_path: Path) -> None:
        lock = tmp_path / ".lock"
        proc = _hold(lock, 60)
        proc.kill()
        proc.wait()
        start = time.monotonic()
        with node_lock(lock, timeout=5):
            assert holder_pid(lock) is not None
        assert time.monotonic() - start < 5


class TestState:
    def test_round_trip_and_match(self, tmp_path: Path) -> None:
        state = InstallState("x", "535", "auto", "6.1.0-26-amd64", "535.261.03",
                             "proprietary", "ab" * 32, {"fetch": 1.5})
        write_state(tmp_path, state)
        loaded = read_state(tmp_path)
        assert loaded is not None and loaded.package_digest == "ab" * 32
        assert loaded.matches(kernel_release="6.1.0-26-amd64", requested_version="535",
                              flavour_requested="auto")
        assert not loaded.matches(kernel_release="6.1.0-27-amd64", requested_version="535",
                                  flavour_requested="auto")
        assert [p.name for p in tmp_path.iterdir()] == [".state.json"]
        clear_state(tmp_path)
        assert read_state(tmp_path) is None

    def test_corrupt_state_means_full_run(self, tmp_path: Path) -> None:
        (tmp_path / ".state.json").write_text("{not json")
        assert read_state(tmp_path) is None
