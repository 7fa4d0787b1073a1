"""The kernel's log as records (/dev/kmsg under the dev root) and this boot's identity.

`/dev/kmsg` hands out one record per read(), "prio,seq,usec,flags;message\\n" followed by
continuation lines that start with a space (the record's dictionary: SUBSYSTEM=, DEVICE=).
A new reader starts at the oldest record still in the ring buffer, so what the driver logged
before the agent started (an Xid during the install) is seen too; `seq` orders the records
of one boot and lets a reader skip what it has already read. A reader that falls behind
gets EPIPE once (records overwritten) and then the oldest record left. The agent waits on
the descriptor with select(), so an idle node costs no CPU.

`prio` is the syslog priority: the 3 lowest bits the level, the bits above the facility.
Whatever user space writes to /dev/kmsg gets facility LOG_USER (1) unless it names another,
and "it is not possible to inject messages from userspace with the facility number
LOG_KERN (0)" (the kernel's Documentation/ABI/testing/dev-kmsg, torvalds/linux 07c7b547;
kernel/printk/printk.c devkmsg_write keeps facility 1 when the `<N>` prefix asks for 0):
facility 0 is what tells a record the kernel wrote (`KERNEL_FACILITY`) from a forged one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from dataclasses import dataclass
from pathlib import Path

from installer.node.host import Host

READ_SIZE = 16384  # a record is at most ~1 KiB of text plus its dictionary
MAX_RECORDS = 10000  # per wait: a burst is returned in parts, never unbounded
_EOF_PAUSE_S = 0.2  # a plain file or a FIFO without writer (tests) reads as EOF
KERNEL_FACILITY = 0  # LOG_KERN: only the kernel itself logs with it


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel log record: `level` 0 (emerg) .. 7 (debug), `facility` 0 = the kernel."""

    level: int
    facility: int
    seq: int
    usec: int
    message: str


def parse_record(line: str) -> KmsgRecord | None:
    """A record's first line, or None when it is not one (garbage, a continuation line)."""
    header, sep, message = line.partition(";")
    fields = header.split(",")
    if not sep or len(fields) < 4 or line.startswith(" "):
        return None
    try:
        prio, seq, usec = (int(field) for field in fields[:3])
    except ValueError:
        return None
    if min(prio, seq, usec) < 0:
        return None
    return KmsgRecord(prio & 7, prio >> 3, seq, usec, message.rstrip("\n"))


class Kmsg:
    """The log opened non-blocking; `wait` returns the records that came since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._pending = b""
        self.last_seq: int | None = None
        self.lost = 0  # records the ring buffer overwrote before we read them

    def wait(self, timeout_s: float) -> list[KmsgRecord]:
        """Block up to `timeout_s` for records, then return every one ready (bounded)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            records, eof = self._drain()
            remaining = deadline - time.monotonic()
            if records or remaining <= 0 or self._fd is None:
                return records
            if eof:
                time.sleep(min(remaining, _EOF_PAUSE_S))
                continue
            with contextlib.suppress(InterruptedError):
                select.select([self._fd], [], [], remaining)

    def _drain(self) -> tuple[list[KmsgRecord], bool]:
        """Read until nothing is ready; (records, whether the reader saw end-of-file)."""
        records: list[KmsgRecord] = []
        while self._fd is not None and len(records) < MAX_RECORDS:
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return records, False
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    raise
                continue  # overwritten while we slept: the next read gives the oldest left
            if not data:
                return records, True
            records += self._records(data)
        return records, False

    def _records(self, data: bytes) -> list[KmsgRecord]:
        """Whole lines of `data` as new records (a read from a file may end mid-line)."""
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()[-READ_SIZE:]
        found: list[KmsgRecord] = []
        for raw in lines:
            record = parse_record(raw.decode("utf-8", errors="replace"))
            if record is None:
                continue
            if self.last_seq is not None:
                if record.seq <= self.last_seq:
                    continue  # read before (a reopened or rewound reader)
                self.lost += max(record.seq - self.last_seq - 1, 0)
            self.last_seq = record.seq
            found.append(record)
        return found

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def kmsg_path(host: Host) -> Path:
    """The node's /dev/kmsg (the log is not namespaced: any container sees the node's)."""
    return host.roots.dev / "kmsg"


def open_kmsg(host: Host) -> Kmsg:
    """Open the node's kernel log; OSError as is (absent; EPERM without CAP_SYSLOG when
    kernel.dmesg_restrict is 1)."""
    return Kmsg(kmsg_path(host))


def boot_id(host: Host) -> str:
    """This boot's random UUID (/proc/sys/kernel/random/boot_id); "" when unreadable."""
    text = host.read_text(host.roots.proc / "sys/kernel/random/boot_id")
    return (text or "").strip()
