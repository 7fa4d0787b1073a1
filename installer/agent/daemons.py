"""The supervisor: which daemons this node needs, started with pid files, restarted with
capped exponential backoff, stopped through their pid files.

What runs where (as NVIDIA's driver container decides, from the node):
- every node, unless PERSISTENCE_MODE=off: `nvidia-persistenced --persistence-mode` (plus
  `--uvm-persistence-mode` where the driver branch has it, R550+);
- NVSwitch nodes: `nv-fabricmanager -c <config>`;
- NVLink5 nodes: once `mlx5_core` and `ib_umad` are loaded, the NVLink Subnet Manager, then
  Fabric Manager.
States follow supervisord's shape: a daemon is STARTING (for its first START_S seconds),
RUNNING, BACKOFF (exited; starts again at `next_start`), WAITING (for the InfiniBand
modules) or STOPPED; REFUSED when its staged binary is not the file the package staged
(its sha256, a link, not a regular file) or its pid file is no regular file: not started,
checked again every BACKOFF_CAP_S. Transitions happen in `tick`, on the loop's clock
(time.monotonic()). Each start goes through installer.node.daemons: exec'd from a
descriptor opened in the host root and hashed, recorded in `<work>/daemons/`; a daemon an
earlier agent left running is adopted only when that record proves it ours.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from installer.config import Config
from installer.config.agent import uvm_persistence
from installer.node import daemons as seam
from installer.node import programs
from installer.node.host import Host, write_atomic

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
START_S = 1.0  # alive this long after its start: RUNNING (supervisord's startsecs)
STABLE_S = 60.0  # a run this long resets the failure count
FAILING_AFTER = 5  # consecutive short runs: the daemon "keeps failing"
TAIL_LINES = 10
LOG_LIMIT = 1 << 20  # a daemon's log in the work area is cut back past 1 MiB
FABRIC_DAEMONS = ("nvlsm", "nv-fabricmanager")

STARTING, RUNNING, BACKOFF, WAITING, STOPPED, REFUSED = (
    "starting", "running", "backoff", "waiting", "stopped", "refused")
ALIVE = (STARTING, RUNNING)


@dataclass(frozen=True)
class Spec:
    """One daemon to run: its name (also its pid file's), argv (argv[0] the staged binary),
    whether it waits for the InfiniBand modules (NVLink5), and the binary's sha256."""

    name: str
    argv: tuple[str, ...]
    needs_ib: bool = False
    sha256: str | None = None


def persistenced_spec(config: Config, binary: Path, driver_version: str,
                      sha256: str | None = None) -> Spec:
    """`nvidia-persistenced --persistence-mode [--uvm-persistence-mode]`, in the foreground
    so that its exit is seen (NVIDIA's container lets it fork; we supervise it)."""
    argv = [str(binary), "--persistence-mode"]
    if uvm_persistence(config.uvm_persistence_mode, driver_version):
        argv.append("--uvm-persistence-mode")
    return Spec("nvidia-persistenced", (*argv, "--foreground"), sha256=sha256)


@dataclass
class Supervised:
    """A daemon's live state."""

    spec: Spec
    state: str = STOPPED
    process: subprocess.Popen[bytes] | None = None
    adopted_pid: int | None = None  # started by an earlier agent, found by its pid file
    pidfd: int | None = None
    started_at: float = 0.0  # on the loop's clock; for an adopted one, from its start time
    start_ticks: int | None = None  # /proc/PID/stat's start time of the process
    refused: str | None = None  # why it is not started (REFUSED)
    next_start: float = 0.0
    failures: int = 0
    restarts: int = 0
    last_exit: int | None = None
    tail: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else self.adopted_pid

    def describe(self) -> dict[str, Any]:
        return {"state": self.state, "pid": self.pid, "restarts": self.restarts,
                "failures": self.failures, "last_exit": self.last_exit,
                **({"refused": self.refused} if self.refused else {})}


class Supervisor:
    """Runs the specs in order; `tick` makes every due transition."""

    def __init__(self, host: Host, specs: list[Spec], *, work: Path, log: Any,
                 missing_ib: Callable[[], list[str]] = list,
                 env: Mapping[str, str] | None = None) -> None:
        self.host, self.work, self.log = host, work, log
        self.records = work / "daemons"  # installer.installdir.daemons.records_dir
        self.daemons = [Supervised(spec) for spec in specs]
        self.missing_ib = missing_ib
        self.env = env

    def adopt(self) -> None:
        """Daemons an earlier agent (or `agent --once`) left running are kept, not doubled:
        only a process the record proves ours, running the staged binary of now."""
        for daemon in self.daemons:
            name, path = daemon.spec.name, seam.pid_file(self.host, daemon.spec.name)
            if not os.path.lexists(path):
                continue
            try:
                pid = seam.running_pid(path, name, self.records, self._identity(daemon))
                daemon.pidfd = os.pidfd_open(pid)
            except (seam.NotOurs, programs.ProgramError, OSError) as exc:
                self.log.info("pid file names no daemon of ours: not adopted", daemon=name,
                              pid_file=str(path), why=str(exc))
                continue
            daemon.adopted_pid, daemon.state = pid, RUNNING
            daemon.start_ticks = programs.start_ticks(pid)
            daemon.started_at = programs.started_monotonic(daemon.start_ticks)
            self.log.info("daemon already running: adopted", daemon=name, pid=pid)

    def _identity(self, daemon: Supervised) -> tuple[int, int]:
        program = programs.open_program(self.host, Path(daemon.spec.argv[0]),
                                        daemon.spec.sha256)
        program.close()
        return program.dev, program.ino

    def tick(self, now: float) -> list[Supervised]:
        """Reap exits, start what is due; returns the daemons that exited since last tick."""
        exited = []
        ib_missing: list[str] | None = None
        for daemon in self.daemons:
            if daemon.state in ALIVE and self._exited(daemon):
                self._finish(daemon, now)
                exited.append(daemon)
            elif daemon.state == STARTING and now - daemon.started_at >= START_S:
                daemon.state = RUNNING  # STARTING -> RUNNING: it survived its start
            elif daemon.state == RUNNING and daemon.failures and \
                    now - daemon.started_at >= STABLE_S:
                daemon.failures = 0  # a minute up: it no longer "keeps failing"
            if daemon.state in (STOPPED, BACKOFF, WAITING, REFUSED) and \
                    now >= daemon.next_start:
                if daemon.spec.needs_ib:
                    ib_missing = self.missing_ib() if ib_missing is None else ib_missing
                    if ib_missing:
                        daemon.state = WAITING
                        continue
                self._start(daemon, now)
        return exited

    def _start(self, daemon: Supervised, now: float) -> None:
        """STOPPED/BACKOFF/WAITING -> RUNNING (or BACKOFF when it cannot even start)."""
        log_file = self.work / "logs" / f"{daemon.spec.name}.log"
        _trim(log_file)
        try:
            program = programs.open_program(self.host, Path(daemon.spec.argv[0]),
                                            daemon.spec.sha256)
            try:
                seam.check_pid_file(self.host, daemon.spec.name)
                started = seam.start_daemon(self.host, daemon.spec.name, daemon.spec.argv,
                                            program=program, log_file=log_file,
                                            records=self.records, env=self.env)
            finally:
                program.close()
        except programs.ProgramError as exc:
            if exc.refused:
                self._refuse(daemon, str(exc), now)
                return
            self._cannot_start(daemon, str(exc), now)
            return
        except OSError as exc:
            self._cannot_start(daemon, f"cannot start {daemon.spec.argv[0]}: {exc.strerror}",
                               now)
            return
        daemon.process, daemon.adopted_pid, daemon.refused = started.process, None, None
        daemon.state, daemon.started_at = STARTING, now
        daemon.start_ticks = started.start_ticks
        self.log.info("daemon started", daemon=daemon.spec.name, pid=started.pid,
                      argv=list(daemon.spec.argv))

    def _cannot_start(self, daemon: Supervised, why: str, now: float) -> None:
        daemon.tail, daemon.last_exit, daemon.refused = [why], None, None
        self._backoff(daemon, now)

    def _refuse(self, daemon: Supervised, why: str, now: float) -> None:
        """Not started: the file or pid file is not what the package staged; the reason is
        the verdict's. Looked at again every BACKOFF_CAP_S (a restaged binary starts)."""
        if daemon.refused != why:
            self.log.error("daemon not started", daemon=daemon.spec.name, why=why)
        daemon.tail, daemon.last_exit, daemon.refused = [why], None, why
        daemon.state, daemon.next_start = REFUSED, now + BACKOFF_CAP_S

    def _exited(self, daemon: Supervised) -> bool:
        if daemon.process is not None:
            return daemon.process.poll() is not None
        if daemon.pidfd is not None:
            readable, _, _ = select.select([daemon.pidfd], [], [], 0)
            return bool(readable)
        return True

    def _finish(self, daemon: Supervised, now: float) -> None:
        """RUNNING -> BACKOFF: note the exit and the log's last lines."""
        daemon.last_exit = daemon.process.returncode if daemon.process is not None else None
        daemon.tail = tail(self.work / "logs" / f"{daemon.spec.name}.log")
        self._forget(daemon)
        if now - daemon.started_at >= STABLE_S:
            daemon.failures = 0
        self._backoff(daemon, now)
        self.log.warning("daemon exited", daemon=daemon.spec.name, code=daemon.last_exit,
                         failures=daemon.failures, restart_in_s=round(daemon.next_start - now),
                         last_lines=daemon.tail[-3:])

    def _backoff(self, daemon: Supervised, now: float) -> None:
        daemon.failures += 1
        daemon.state = BACKOFF
        daemon.next_start = now + min(BACKOFF_CAP_S,
                                      BACKOFF_BASE_S * 2 ** (daemon.failures - 1))
        daemon.restarts += 1

    def _forget(self, daemon: Supervised) -> None:
        if daemon.pidfd is not None:
            os.close(daemon.pidfd)
        daemon.process, daemon.adopted_pid, daemon.pidfd = None, None, None
        with contextlib.suppress(FileNotFoundError):
            seam.pid_file(self.host, daemon.spec.name).unlink()
        with contextlib.suppress(FileNotFoundError):
            seam.record_file(self.records, daemon.spec.name).unlink()

    def any_exited(self) -> bool:
        """Has a daemon that was alive exited since the last tick? (The loop wakes for it.)"""
        return any(d.state in ALIVE and self._exited(d) for d in self.daemons)

    def failing(self) -> list[Supervised]:
        """Daemons that keep failing (FAILING_AFTER short runs in a row)."""
        return [d for d in self.daemons if d.failures >= FAILING_AFTER]

    def refused(self) -> list[Supervised]:
        """Daemons not started because their program or pid file is not what was staged."""
        return [d for d in self.daemons if d.state == REFUSED]

    def down(self) -> list[Supervised]:
        """Daemons not running now (exited, waiting, never started)."""
        return [d for d in self.daemons if d.state != RUNNING]

    def next_due(self) -> float | None:
        """When the next transition is due (a restart, a start confirmed), if any."""
        due = [d.next_start for d in self.daemons if d.state in (BACKOFF, STOPPED, REFUSED)]
        due += [d.started_at + START_S for d in self.daemons if d.state == STARTING]
        return min(due) if due else None

    def stop_all(self, timeout_s: float, *, only_started: bool = False) -> list[str]:
        """Stop every daemon through its pid file, last started first; the names stopped.
        `only_started`: leave adopted ones running (`agent --once` on a live node)."""
        stopped = []
        for daemon in reversed(self.daemons):
            if daemon.state not in ALIVE or (only_started and daemon.process is None):
                continue
            path = seam.pid_file(self.host, daemon.spec.name)
            if seam.stop_daemon(self.host, path, timeout_s=timeout_s, records=self.records):
                stopped.append(daemon.spec.name)
            elif daemon.process is not None and daemon.process.poll() is None:
                # our own child, whatever its pid file says now (a child not yet reaped
                # keeps its pid: this signals no other process)
                _stop_child(daemon.process, timeout_s)
                stopped.append(daemon.spec.name)
            if daemon.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.process.wait(timeout=1.0)
            self._forget(daemon)
            daemon.state = STOPPED
        return stopped


def _stop_child(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`: a daemon this process started itself."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5.0)


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last lines of a daemon's log (bounded read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 8192))
            data = handle.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    return [line[:300] for line in text if line.strip()][-lines:]


def _trim(path: Path) -> None:
    """A log past LOG_LIMIT is cut back to its tail (the daemon appends with O_APPEND)."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_LIMIT:
            write_atomic(path, "\n".join(tail(path, 200)).encode() + b"\n")
