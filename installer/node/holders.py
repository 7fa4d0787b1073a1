"""Who holds the GPUs: processes with a `/dev/nvidia*` file open, and the pod of each.

The scan reads `/proc/<pid>/fd` links and `/proc/<pid>/cgroup` through the Host seam, so
tests point it at a temp tree and the kernel tier at a real `/proc`. A process whose cgroup
names no pod is a host process: it is reported, never signalled.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from installer.node import cgroup
from installer.node.host import Host

DEVICE_PREFIX = "/dev/nvidia"


@dataclass(frozen=True)
class Holder:
    """One process holding an NVIDIA device file, and its pod when it runs in one."""

    pid: int
    command: str
    pod: cgroup.PodCgroup | None

    def describe(self) -> str:
        """`1234 (python3)`, plus the pod UID when there is one: what an operator greps."""
        where = f" in pod {self.pod.pod_uid}" if self.pod else " (not in a pod)"
        return f"{self.pid} ({self.command}){where}"


def processes_using_nvidia(host: Host, devices: Collection[str] | None = None
                           ) -> list[tuple[int, str]]:
    """(PID, command) of every process with a /dev/nvidia* file open (scans /proc/*/fd);
    with `devices`, only those holding one of these paths (one GPU's `/dev/nvidia3`)."""
    found: list[tuple[int, str]] = []
    for proc_dir in host.iterdir(host.roots.proc):
        if not proc_dir.name.isdigit():
            continue
        try:
            fds = list(host.iterdir(proc_dir / "fd"))
        except OSError:
            continue  # exited, or not ours to read
        links = [host.readlink(fd) or "" for fd in fds]
        if any(link in devices if devices is not None else link.startswith(DEVICE_PREFIX)
               for link in links):
            comm = (host.read_text(proc_dir / "comm") or "?").strip()
            found.append((int(proc_dir.name), comm))
    return sorted(found)


def find_holders(host: Host, devices: Collection[str] | None = None) -> list[Holder]:
    """Every holder (of `devices` when given) with its pod (from /proc/<pid>/cgroup),
    sorted by PID."""
    holders = []
    for pid, command in processes_using_nvidia(host, devices):
        try:
            text = host.read_text(host.roots.proc / str(pid) / "cgroup") or ""
        except OSError:
            text = ""  # exited between the two reads: no pod we can name
        holders.append(Holder(pid, command, cgroup.parse(text)))
    return holders
