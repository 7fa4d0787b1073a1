"""tests/prefetch.py, as `make test` runs it: `--start` returns at once and leaves a detached
run whose log and pid file are in the test cache; `--stop` ends only that run, never a process
a stale pid file names. The steps themselves are the kernel tier's fixtures (their own
tests); here GNI_PREFETCH_ONLY picks none, or one that fails."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "prefetch.py"


def _run(cache: Path, *args: str, only: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GNI_TEST_CACHE": str(cache), "GNI_PREFETCH_ONLY": only}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, check=False, env=env)


def _wait_gone(pid: int) -> None:
    """Until the detached run (init's child, not ours) is gone or a zombie."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except FileNotFoundError:
            return
        if state == b"Z":
            return
        time.sleep(0.1)
    raise AssertionError(f"prefetch {pid} still runs")


def test_start_detaches_logs_and_stop_cleans_up(tmp_path: Path) -> None:
    done = _run(tmp_path, "--start")
    assert done.returncode == 0, done.stderr
    assert f"log: {tmp_path / 'prefetch.log'}" in done.stdout
    pid = int((tmp_path / "prefetch.pid").read_text())
    _wait_gone(pid)
    assert (tmp_path / "prefetch.log").read_text().startswith("--- prefetch started ")
    stopped = _run(tmp_path, "--stop")
    assert stopped.returncode == 0 and not (tmp_path / "prefetch.pid").exists()


def test_a_failed_step_is_logged_and_the_run_goes_on(tmp_path: Path) -> None:
    bad = {**os.environ, "GNI_TEST_CACHE": str(tmp_path), "GNI_PREFETCH_ONLY": "NVIDIA 535 .debs",
           "PATH": str(tmp_path / "no-tools")}  # apt-get is not found: the step fails
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=120, check=False, env=bad)
    assert done.returncode == 1
    assert "prefetch: NVIDIA 535 .debs: FAILED after" in done.stderr


def test_stop_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (tmp_path / "prefetch.pid").write_text(f"{other.pid}\n")  # stale: names another
        assert _run(tmp_path, "--stop").returncode == 0
        assert other.poll() is None, "--stop signalled a process that is not the prefetch"
    finally:
        other.kill()
        other.wait()
