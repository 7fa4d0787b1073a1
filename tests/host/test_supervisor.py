"""installer.agent.daemons: the supervisor's transitions, one test each, on its own clock
(`tick(now)` takes the time) with real short-lived processes as the daemons."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

import structlog

from installer.agent import daemons
from installer.agent.daemons import Spec, Supervisor
from installer.node.host import RealHost, Roots


def program(tmp_path: Path, name: str, original: str) -> tuple[str, str]:
    """A copy of `original` under the host root and its sha256 (what the stage records)."""
    copy = tmp_path / "bin" / name
    if not copy.exists():
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(shutil.which(original) or f"/bin/{original}", copy)
        copy.chmod(0o755)
    return str(copy), hashlib.sha256(copy.read_bytes()).hexdigest()


def sleeper(tmp_path: Path, **options: bool) -> Spec:
    """`sleep 300` as the daemon nvlsm: a copy of sleep named like it."""
    path, sha256 = program(tmp_path, "nvlsm", "sleep")
    return Spec("nvlsm", (path, "300"), sha256=sha256, **options)


def crash(tmp_path: Path) -> Spec:
    path, sha256 = program(tmp_path, "sh", "sh")
    return Spec("nvlsm", (path, "-c", "echo 'fatal: no NVSwitch found'; exit 3"),
                sha256=sha256)


def supervisor(tmp_path: Path, *specs: Spec, missing: list[str] | None = None) -> Supervisor:
    for name in ("proc", "sys", "dev"):
        (tmp_path / name).mkdir(exist_ok=True)
    host = RealHost(Roots(tmp_path, tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"))
    return Supervisor(host, list(specs), work=tmp_path / "work", log=structlog.get_logger(),
                      missing_ib=lambda: list(missing or []))


def exited(sup: Supervisor, now: float) -> list[str]:
    """Tick until the running daemon's exit is seen (real processes take a moment)."""
    deadline = time.monotonic() + 30
    while True:
        gone = sup.tick(now)
        if gone or time.monotonic() > deadline:
            return [d.spec.name for d in gone]
        time.sleep(0.02)


def test_started_is_starting_then_running_after_start_s(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, sleeper(tmp_path))
    try:
        sup.tick(100.0)
        (daemon,) = sup.daemons
        assert daemon.state == daemons.STARTING and daemon.pid is not None
        assert (tmp_path / "var/run/nvidia-fabricmanager/nvlsm.pid").read_text() == \
            f"{daemon.pid}\n"
        sup.tick(100.0 + daemons.START_S)
        assert daemon.state == daemons.RUNNING
        assert sup.down() == [] and sup.next_due() is None
    finally:
        assert sup.stop_all(5.0) == ["nvlsm"]
    assert sup.daemons[0].state == daemons.STOPPED


def test_an_exit_is_backoff_with_its_code_and_last_lines(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, crash(tmp_path))
    sup.tick(100.0)
    assert exited(sup, 100.5) == ["nvlsm"]
    (daemon,) = sup.daemons
    assert daemon.state == daemons.BACKOFF and daemon.last_exit == 3
    assert daemon.tail == ["fatal: no NVSwitch found"]
    assert daemon.next_start == 101.5  # 1 s after the exit
    assert not (tmp_path / "var/run/nvidia-fabricmanager/nvlsm.pid").exists()


def test_backoff_doubles_and_five_short_runs_keep_failing(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, crash(tmp_path))
    now, delays = 100.0, []
    for _ in range(daemons.FAILING_AFTER):
        assert sup.failing() == []
        sup.tick(now)  # starts it (due)
        exited(sup, now)
        delays.append(sup.daemons[0].next_start - now)
        now = sup.daemons[0].next_start
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert [d.spec.name for d in sup.failing()] == ["nvlsm"]
    assert sup.daemons[0].restarts == 5


def test_the_backoff_is_capped(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, Spec("nvlsm", (str(tmp_path / "nonexistent/nvlsm"),),
                                    sha256="0" * 64))
    for step in range(10):  # cannot even start: a failure each time, no process
        sup.tick(1000.0 * step)
    (daemon,) = sup.daemons
    assert daemon.next_start - 9000.0 == daemons.BACKOFF_CAP_S
    assert daemon.tail == [f"cannot start {tmp_path}/nonexistent/nvlsm: "
                           "No such file or directory"]


def test_a_minute_up_clears_the_failures(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, sleeper(tmp_path))
    try:
        sup.tick(100.0)
        sup.daemons[0].failures = daemons.FAILING_AFTER  # after a bad streak
        sup.tick(101.0)
        assert sup.failing() != []
        sup.tick(100.0 + daemons.STABLE_S)
        assert sup.failing() == [] and sup.daemons[0].state == daemons.RUNNING
    finally:
        sup.stop_all(5.0)


def test_a_daemon_needing_infiniband_waits_for_the_modules(tmp_path: Path) -> None:
    missing = ["mlx5_core", "ib_umad"]
    sup = supervisor(tmp_path, sleeper(tmp_path, needs_ib=True), missing=missing)
    try:
        sup.tick(100.0)
        assert sup.daemons[0].state == daemons.WAITING and sup.daemons[0].pid is None
        missing.clear()
        sup.tick(105.0)
        assert sup.daemons[0].state == daemons.STARTING
    finally:
        sup.stop_all(5.0)


def test_adopts_a_daemon_an_earlier_agent_left_and_sees_it_exit(tmp_path: Path) -> None:
    first = supervisor(tmp_path, sleeper(tmp_path))
    first.tick(100.0)
    pid = first.daemons[0].pid
    assert pid is not None
    deadline = time.monotonic() + 30  # until the program is `sleep` (Popen returns mid-exec)
    while daemons.seam.command_line(pid)[:1] != [sleeper(tmp_path).argv[0]]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = supervisor(tmp_path, sleeper(tmp_path))
    second.adopt()
    assert second.daemons[0].state == daemons.RUNNING and second.daemons[0].pid == pid
    assert second.tick(200.0) == []  # nothing started twice
    first.daemons[0].process.terminate()  # type: ignore[union-attr]
    first.daemons[0].process.wait()  # type: ignore[union-attr]
    assert [d.spec.name for d in second.tick(201.0)] == ["nvlsm"]
    assert second.daemons[0].state == daemons.BACKOFF


def test_stop_signals_its_own_child_never_the_pid_a_rewritten_pid_file_names(
        tmp_path: Path) -> None:
    """The pid file now names a foreign process (written over by anyone root on the node):
    the supervisor stops the daemon it started through its own child handle, and the
    foreign process is never signalled."""
    sup = supervisor(tmp_path, sleeper(tmp_path))
    other = subprocess.Popen(["sleep", "300"])
    try:
        sup.tick(100.0)
        ours = sup.daemons[0].process
        assert ours is not None
        (tmp_path / "var/run/nvidia-fabricmanager/nvlsm.pid").write_text(f"{other.pid}\n")
        assert sup.stop_all(5.0) == ["nvlsm"]
        assert ours.poll() is not None
        assert other.poll() is None  # alive: never signalled
    finally:
        other.kill()
        other.wait()
