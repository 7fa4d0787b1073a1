"""The driver's daemons as processes on the node: start one with its pid file, stop one by it.

Pid files live on the node, under the host root, where NVIDIA's own scripts put them
(`/var/run/nvidia-fabricmanager/`, `/var/run/nvidia-persistenced/`), so whoever comes next
(the agent of a new pod, the upgrade flow before it unloads the modules) finds the daemons
the last pod started. A pid is only a number that the kernel recycles: `stop_daemon` signals
it through a pidfd (pidfd_open(2)), and only after the process's own command line, read
through that pidfd's process, names the daemon the pid file is for. A pid file naming
anything else is left alone (and reported as not stopped).

The pid is read in this process's pid namespace (the pod runs with `hostPID`, so that is the
node's), hence `/proc` here is this process's own procfs, not `--proc-root`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.node.host import Host, write_atomic

OWN_PROC = Path("/proc")  # the procfs of the pid namespace that kill() acts in
FABRIC_RUN = PurePosixPath("/var/run/nvidia-fabricmanager")
PERSISTENCED_RUN = PurePosixPath("/var/run/nvidia-persistenced")
PID_FILES: dict[str, PurePosixPath] = {
    "nv-fabricmanager": FABRIC_RUN / "nv-fabricmanager.pid",
    "nvlsm": FABRIC_RUN / "nvlsm.pid",
    "nvidia-persistenced": PERSISTENCED_RUN / "nvidia-persistenced.pid",
}
MAX_PID_FILE = 64


def pid_file(host: Host, name: str) -> Path:
    """Where daemon `name`'s pid file is, as a path here (on the node, under the host root)."""
    return host.roots.node_entry(PID_FILES[name])


def known_pid_files(host: Host) -> list[Path]:
    """Every daemon's pid file, in the order to stop them (Fabric Manager before NVLSM)."""
    return [pid_file(host, name) for name in PID_FILES]


@dataclass
class Started:
    """A daemon this process started: its process, pid file and log file."""

    name: str
    process: subprocess.Popen[bytes]
    pid_file: Path
    log_file: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def start_daemon(host: Host, name: str, argv: Sequence[str], *, log_file: Path,
                 env: Mapping[str, str] | None = None) -> Started:
    """Start `argv` as daemon `name` in its own session, output appended to `log_file`
    (the agent reads its tail for Events), and write its pid file on the node.

    Raises OSError when the program cannot be started (missing, not executable)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, start_new_session=True,
            close_fds=True)
    path = pid_file(host, name)
    write_atomic(path, f"{process.pid}\n".encode())
    return Started(name, process, path, log_file)


def read_pid(path: Path) -> int | None:
    """The pid a pid file names, or None (absent, empty, not a positive number)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_PID_FILE).decode("ascii", errors="replace").strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 2**22 else None


def command_line(pid: int) -> list[str]:
    """A process's argv (empty for a zombie, a kernel thread or a process gone)."""
    try:
        raw = (OWN_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_daemon(argv: Sequence[str], name: str) -> bool:
    """Is this the daemon `name`? Its program, or a script run by an interpreter (the first
    argument after it), must be named `name`."""
    return any(os.path.basename(part) == name for part in argv[:2])


def running_pid(path: Path, name: str) -> int | None:
    """The pid in `path` if that process is alive and is daemon `name`, else None."""
    pid = read_pid(path)
    if pid is None or not is_daemon(command_line(pid), name):
        return None
    return pid


def stop_daemon(host: Host, pid_file: Path, *, timeout_s: float) -> bool:
    """Stop the daemon a pid file names: SIGTERM, wait up to `timeout_s`, then SIGKILL.

    True when a matching daemon was running and is gone now; False when the pid file is
    absent, stale, or names another program (never signalled). The pid file is removed
    once its daemon is gone or it is stale; one naming another program is kept."""
    del host  # the seam's signature: pid files are paths here, the pids ours to signal
    name = pid_file.name.removesuffix(".pid")
    pid = read_pid(pid_file)
    if pid is None:
        _remove(pid_file)
        return False
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        _remove(pid_file)
        return False
    try:
        argv = command_line(pid)  # read after the pidfd pins this very process
        if not argv:
            _remove(pid_file)
            return False
        if not is_daemon(argv, name):
            return False
        stopped = _terminate(fd, pid, timeout_s)
    finally:
        os.close(fd)
    if stopped:
        _remove(pid_file)
    return stopped


def stop_all(host: Host, *, timeout_s: float) -> list[str]:
    """Stop every daemon a pid file names (Fabric Manager first): what the upgrade flow does
    before it unloads the modules they hold. The daemons stopped, by name."""
    return [path.name.removesuffix(".pid") for path in known_pid_files(host)
            if stop_daemon(host, path, timeout_s=timeout_s)]


def _terminate(fd: int, pid: int, timeout_s: float) -> bool:
    """SIGTERM through the pidfd, wait for it to exit, SIGKILL after `timeout_s`."""
    try:
        signal.pidfd_send_signal(fd, signal.SIGTERM)
    except ProcessLookupError:
        return True
    if _exited(fd, pid, timeout_s):
        return True
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    return _exited(fd, pid, 5.0)


def _exited(fd: int, pid: int, timeout_s: float) -> bool:
    """Wait until the process has exited: its pidfd turns readable on exit, zombie or not.
    Never reaped here: a parent (the supervisor's Popen) collects its own child's status."""
    del pid
    ready, _, _ = select.select([fd], [], [], max(0.0, timeout_s))
    return bool(ready)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        path.unlink()
