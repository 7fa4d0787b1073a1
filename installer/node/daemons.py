"""The driver's daemons as processes on the node: start one with its pid file and a record
of it, adopt or stop one only when that record proves it ours.

Pid files live on the node, under the host root, where NVIDIA's own scripts put them
(`/var/run/nvidia-fabricmanager/`, `/var/run/nvidia-persistenced/`), so whoever comes next
(the agent of a new pod, the upgrade flow before it unloads the modules) finds the daemons
the last pod started. A pid is only a number that the kernel recycles and a pid file is
only a file anyone root on the node may write, so neither is trusted alone: each start also
writes a record in the agent's work area (`records`, `<install dir>/.agent/daemons/`) with
the pid, the process's start time (clock ticks since boot, /proc/PID/stat field 22), this
boot's id and the (device, inode) and sha256 of the program exec'd. A process is ours only
when the record names its pid, start time and boot and `/proc/PID/exe` is that file; the
agent also wants it to be the staged binary of now. Anything else is never signalled.
Pid files and records are read bounded, non-blocking and regular files only.

The programs are exec'd through a descriptor opened inside the host root and hashed there
(installer.node.programs), never through a path. The pid is read in this process's pid
namespace (the pod runs with `hostPID`, so that is the node's), hence `/proc` here is this
process's own procfs, not `--proc-root`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.node import programs
from installer.node.host import Host, write_atomic

OWN_PROC = Path("/proc")  # the procfs of the pid namespace that kill() acts in
FABRIC_RUN = PurePosixPath("/var/run/nvidia-fabricmanager")
PERSISTENCED_RUN = PurePosixPath("/var/run/nvidia-persistenced")
IMEX_RUN = PurePosixPath("/var/run/nvidia-imex")  # the agent's own pid file for IMEX=host
PID_FILES: dict[str, PurePosixPath] = {
    "nvidia-imex": IMEX_RUN / "nvidia-imex.pid",  # stopped first: it uses the fabric
    "nv-fabricmanager": FABRIC_RUN / "nv-fabricmanager.pid",
    "nvlsm": FABRIC_RUN / "nvlsm.pid",
    "nvidia-persistenced": PERSISTENCED_RUN / "nvidia-persistenced.pid",
}
MAX_PID_FILE = 64
MAX_RECORD = 4096


def pid_file(host: Host, name: str) -> Path:
    """Where daemon `name`'s pid file is, as a path here (on the node, under the host root)."""
    return host.roots.node_entry(PID_FILES[name])


def known_pid_files(host: Host) -> list[Path]:
    """Every daemon's pid file, in the order to stop them (Fabric Manager before NVLSM)."""
    return [pid_file(host, name) for name in PID_FILES]


class NotOurs(Exception):
    """A pid file names no process this installer can prove it started (the reason)."""


@dataclass
class Started:
    """A daemon this process started: its process, pid file, log file and start."""

    name: str
    process: subprocess.Popen[bytes]
    pid_file: Path
    log_file: Path
    start_ticks: int | None
    started_at: float  # time.monotonic() at the start

    @property
    def pid(self) -> int:
        return self.process.pid


def record_file(records: Path, name: str) -> Path:
    """Where the record of daemon `name`'s last start is (the agent's work area)."""
    return records / f"{name}.json"


def start_daemon(host: Host, name: str, argv: Sequence[str], *, program: programs.Program,
                 log_file: Path, records: Path,
                 env: Mapping[str, str] | None = None) -> Started:
    """Start `argv` as daemon `name` in its own session, exec'd from `program`'s descriptor
    (argv[0] is only its name), output appended to `log_file` (the agent reads its tail for
    Events); then write its record and its pid file on the node.

    Raises OSError when it cannot be exec'd, ProgramError when the file was written to
    while it started (the process is killed: it may run something else than was hashed)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            list(argv), executable=program.exec_path, pass_fds=(program.fd,),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, start_new_session=True,
            close_fds=True)
    started_at = time.monotonic()
    if not programs.unchanged(program):
        process.kill()
        process.wait()
        raise programs.ProgramError(f"{program.path} was written to while it started",
                                    refused=True)
    ticks = programs.start_ticks(process.pid)
    record = {"pid": process.pid, "start_ticks": ticks, "boot_id": programs.boot_id(),
              "dev": program.dev, "ino": program.ino, "sha256": program.sha256,
              "program": str(program.path)}
    write_atomic(record_file(records, name), json.dumps(record).encode())
    path = pid_file(host, name)
    write_atomic(path, f"{process.pid}\n".encode())
    return Started(name, process, path, log_file, ticks, started_at)


def check_pid_file(host: Host, name: str) -> None:
    """ProgramError (refused) when daemon `name`'s pid file is there but no regular file
    (a FIFO, a directory, a link): not ours to replace, and the daemon would write through
    it."""
    path = pid_file(host, name)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        raise programs.ProgramError(
            f"its pid file {path} is {programs.kind_of(mode)}, not a regular file (remove "
            "it: the daemon writes its pid there)", refused=True)


def read_pid(path: Path) -> int | None:
    """The pid a pid file names, or None (absent, empty, not a positive number); OSError
    naming the kind of a pid file that is no regular file (a FIFO is never waited on)."""
    data = programs.read_small(path, MAX_PID_FILE)
    text = "" if data is None else data.decode("ascii", errors="replace").strip()
    return int(text) if text.isdigit() and 0 < int(text) < 2**22 else None


def command_line(pid: int) -> list[str]:
    """A process's argv (empty for a zombie, a kernel thread or a process gone)."""
    try:
        raw = (OWN_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def check_ours(pid: int, name: str, records: Path,
               program: tuple[int, int] | None = None) -> None:
    """NotOurs unless the record of `name` names this very process (pid, start time, boot)
    and it runs the file recorded, which is `program` (device, inode) when given."""
    try:
        data = programs.read_small(record_file(records, name), MAX_RECORD)
        record = json.loads(data) if data is not None else None
    except (OSError, ValueError) as exc:
        raise NotOurs(f"its record cannot be read ({getattr(exc, 'strerror', None) or exc})"
                      ) from None
    if not isinstance(record, dict):
        raise NotOurs("this installer has no record of starting it")
    if record.get("pid") != pid or record.get("boot_id") != programs.boot_id():
        raise NotOurs(f"the record of {name}'s start names another process")
    ticks = programs.start_ticks(pid)
    if ticks is None or record.get("start_ticks") != ticks:
        raise NotOurs(f"pid {pid} started at another time than the {name} recorded "
                      "(a recycled pid)")
    exe = programs.exe_identity(pid)
    if exe is None or [record.get("dev"), record.get("ino")] != list(exe):
        raise NotOurs(f"pid {pid} does not run the program {name} was started from")
    if program is not None and exe != program:
        raise NotOurs(f"pid {pid} runs another file than the staged {name}")


def running_pid(path: Path, name: str, records: Path,
                program: tuple[int, int] | None = None) -> int:
    """The pid in `path` if that process is alive and provably our daemon `name`; NotOurs
    (the reason) otherwise, also when there is no pid at all."""
    try:
        pid = read_pid(path)
    except OSError as exc:
        raise NotOurs(f"its pid file {exc.strerror}") from None
    if pid is None:
        raise NotOurs("no pid file names a process")
    check_ours(pid, name, records, program)
    return pid


def stop_daemon(host: Host, pid_file: Path, *, timeout_s: float, records: Path) -> bool:
    """Stop the daemon a pid file names: SIGTERM, wait up to `timeout_s`, then SIGKILL.

    True when our daemon was running and is gone now; False when the pid file is absent,
    stale, or names a process this installer cannot prove it started (never signalled:
    the pidfd pins the process while its start time and program are checked). The pid
    file and record are removed once the daemon is gone or the pid is stale; a pid file
    naming a live process not ours, or no regular file, is left as it is."""
    del host  # the seam's signature: pid files are paths here, the pids ours to signal
    name = pid_file.name.removesuffix(".pid")
    try:
        pid = read_pid(pid_file)
    except OSError:
        return False
    if pid is None:
        _remove(pid_file)
        return False
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        _remove(pid_file)
        return False
    try:
        if programs.gone(pid):  # a zombie: exited already
            _remove(pid_file)
            return False
        try:
            check_ours(pid, name, records)
        except NotOurs:
            return False
        stopped = _terminate(fd, pid, timeout_s)
    finally:
        os.close(fd)
    if stopped:
        _remove(pid_file)
        _remove(record_file(records, name))
    return stopped


def stop_all(host: Host, *, timeout_s: float, records: Path) -> list[str]:
    """Stop every daemon of ours a pid file names (Fabric Manager first): what the upgrade
    flow does before it unloads the modules they hold. The daemons stopped, by name."""
    return [path.name.removesuffix(".pid") for path in known_pid_files(host)
            if stop_daemon(host, path, timeout_s=timeout_s, records=records)]


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
