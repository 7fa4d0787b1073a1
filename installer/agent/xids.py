"""Where Xids come from: NVML's Xid events, or the driver's `NVRM: Xid` lines in /dev/kmsg.

The driver logs every Xid as `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off
the bus.` (older branches without `PCI:`), and NVML delivers the same Xid as an event of
type XidCriticalError on the device. Both are read with a bounded wait that is also the
agent's sleep: no polling. A GPU is named by its PCI address as the kernel prints it
(`0000:3b:00`: domain, bus, device), whichever source saw it, so counts add up per GPU.

Anyone on the node can write to the kernel log (a `/dev/kmsg` write, an audit record quoting
a command line), so a kernel log record counts as an Xid only when all three hold: the kernel
wrote it (facility 0: `node.kmsg`), its message starts with the driver's `NVRM: Xid (`,
and it names the PCI address of a GPU this node has (sysfs). Every other record is refused,
said once per cause in the log, and costs no memory: Xid counts stay per real GPU.
"""

from __future__ import annotations

import ctypes
import re
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from installer.node import kmsg, pci
from installer.node.host import Host

DRIVER_PREFIX = "NVRM: Xid ("  # how the driver starts every Xid line it logs
# `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`
_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<device>[0-9a-fA-F]{2})(?:\.[0-7])?\): (?P<code>[0-9]{1,4})\b,?\s*(?P<detail>.*)")
_BUS_ID = re.compile(r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):"
                     r"(?P<device>[0-9a-fA-F]{2})(?:\.[0-7])?")
DETAIL_MAX = 300


@dataclass(frozen=True)
class Xid:
    """One Xid: the GPU (`0000:3b:00`, or an NVML index when no address is known), the code,
    and what the driver said about it."""

    gpu: str
    code: int
    detail: str


class XidSource(Protocol):
    """Xids as they come; `wait` blocks up to its timeout (the agent's sleep)."""

    kind: str  # "nvml", "kmsg" or "none": said in the agent's log and status

    def wait(self, timeout_s: float) -> list[Xid]: ...

    def close(self) -> None: ...


def pci_name(domain: str, bus: str, device: str) -> str:
    """`0000:3b:00`, as the kernel prints a GPU (NVML's `00000000:3B:00.0` maps here too)."""
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"


def parse_xid(message: str) -> Xid | None:
    """The Xid of a message that starts with the driver's prefix, else None (an Xid line
    quoted inside another message, an audit record's command line, is none)."""
    found = _XID_LINE.match(message)
    if found is None:
        return None
    gpu = pci_name(found["domain"], found["bus"], found["device"])
    return Xid(gpu, int(found["code"]), found["detail"].strip()[:DETAIL_MAX])


def node_gpus(host: Host) -> frozenset[str]:
    """The PCI addresses (`0000:3b:00`) of the GPUs sysfs lists on this node."""
    found = (_BUS_ID.fullmatch(f.pci_address) for f in pci.scan(host) if f.kind == pci.KIND_GPU)
    return frozenset(pci_name(m["domain"], m["bus"], m["device"]) for m in found if m)


@dataclass(frozen=True)
class Refused:
    """A record that looks like an Xid line but is not the driver's for this node's GPUs:
    `cause` is one of a few fixed names (counted), `why` the line said in the log."""

    cause: str  # "not-kernel", "not-driver-prefix" or "unknown-gpu"
    why: str


def judge(record: kmsg.KmsgRecord, gpus: Collection[str]) -> Xid | Refused | None:
    """The record's Xid when it is the driver's, for one of `gpus`; why not when it looks
    like an Xid line but is refused; None when it is no Xid line at all."""
    if DRIVER_PREFIX not in record.message:
        return None
    if record.facility != kmsg.KERNEL_FACILITY:
        return Refused("not-kernel", f"not written by the kernel (facility "
                       f"{record.facility}: a user-space write to /dev/kmsg)")
    xid = parse_xid(record.message)
    if xid is None:
        return Refused("not-driver-prefix",
                       f"the message does not start with the driver's {DRIVER_PREFIX!r}")
    if xid.gpu not in gpus:
        return Refused("unknown-gpu", f"GPU {xid.gpu} is not on this node "
                       f"(sysfs lists {len(gpus)} GPU(s))")
    return xid


def accepted_xids(records: Iterable[kmsg.KmsgRecord], gpus: Collection[str]) -> Iterator[Xid]:
    """The driver's Xids among kernel log records, for this node's GPUs only."""
    for record in records:
        verdict = judge(record, gpus)
        if isinstance(verdict, Xid):
            yield verdict


class KmsgXidSource:
    """Xid lines of the kernel log, from the oldest record still in the ring buffer on;
    only the driver's, for `gpus` (this node's). `refused` counts the rest by cause."""

    kind = "kmsg"

    def __init__(self, log: kmsg.Kmsg, gpus: Collection[str]) -> None:
        self.log, self.gpus = log, frozenset(gpus)
        self.refused: Counter[str] = Counter()  # by `Refused.cause`: three keys at most

    def wait(self, timeout_s: float) -> list[Xid]:
        xids: list[Xid] = []
        for record in self.log.wait(timeout_s):
            verdict = judge(record, self.gpus)
            if isinstance(verdict, Xid):
                xids.append(verdict)
            elif verdict is not None:
                self._refuse(verdict, record)
        return xids

    def _refuse(self, refused: Refused, record: kmsg.KmsgRecord) -> None:
        """Count a refused record; log the first of each cause (a flood logs once)."""
        self.refused[refused.cause] += 1
        if self.refused[refused.cause] == 1:
            structlog.get_logger().warning(
                "kernel log record refused as an Xid", reason=refused.why, cause=refused.cause,
                seq=record.seq, message=record.message[:DETAIL_MAX])

    def close(self) -> None:
        self.log.close()


class NvmlXidSource:
    """NVML's Xid events on every GPU that supports them (NVML initialised by the caller).

    `nvml` is the `pynvml` module (tests may pass an object with the same functions).
    """

    kind = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.gpus: dict[int, str] = {}  # handle address -> GPU name
        self.failure: str | None = None  # the last failed wait, while it keeps failing
        self._set = nvml.nvmlEventSetCreate()
        try:
            self._register()
        except nvml.NVMLError:
            nvml.nvmlEventSetFree(self._set)
            raise

    def _register(self) -> None:
        nvml, xid_type = self.nvml, self.nvml.nvmlEventTypeXidCriticalError
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            if not nvml.nvmlDeviceGetSupportedEventTypes(handle) & xid_type:
                continue
            nvml.nvmlDeviceRegisterEvents(handle, xid_type, self._set)
            self.gpus[_address(handle)] = self._name(handle, index)
        if not self.gpus:
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)

    def _name(self, handle: Any, index: int) -> str:
        try:
            bus_id = self.nvml.nvmlDeviceGetPciInfo(handle).busId
        except self.nvml.NVMLError:
            return str(index)
        text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else str(bus_id)
        found = _BUS_ID.fullmatch(text.strip())
        return pci_name(found["domain"], found["bus"], found["device"]) if found else str(index)

    def wait(self, timeout_s: float) -> list[Xid]:
        """The first event may take up to the timeout; the ones queued behind it do not.

        A failed wait (not a timeout: the GPU fell off the bus, the driver went away) is
        kept in `failure`, logged once, and the rest of the timeout slept: never a spin.
        """
        xids: list[Xid] = []
        started, timeout_ms = time.monotonic(), max(int(timeout_s * 1000), 0)
        while len(xids) < kmsg.MAX_RECORDS:
            try:
                event = self.nvml.nvmlEventSetWait_v2(self._set, timeout_ms)
            except self.nvml.NVMLError as exc:
                if exc.value != self.nvml.NVML_ERROR_TIMEOUT:
                    self._failed(str(exc), timeout_s - (time.monotonic() - started))
                break
            timeout_ms, self.failure = 0, None
            if event.eventType & self.nvml.nvmlEventTypeXidCriticalError:
                gpu = self.gpus.get(_address(event.device), "unknown")
                xids.append(Xid(gpu, int(event.eventData), "NVML XidCriticalError event"))
        return xids

    def _failed(self, why: str, remaining_s: float) -> None:
        if why != self.failure:
            structlog.get_logger().warning("NVML Xid event wait failed", detail=why)
        self.failure = why
        time.sleep(max(remaining_s, 0.0))

    def close(self) -> None:
        if self._set is not None:
            self.nvml.nvmlEventSetFree(self._set)
            self._set = None


class NoXidSource:
    """Neither NVML events nor the kernel log could be read: sleep, and say so once."""

    kind = "none"

    def __init__(self, why: str) -> None:
        self.why = why

    def wait(self, timeout_s: float) -> list[Xid]:
        time.sleep(max(timeout_s, 0.0))
        return []

    def close(self) -> None:
        pass


def _address(handle: Any) -> int:
    """A device handle's pointer value: NVML hands out the same handle for a GPU each time."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (ctypes.ArgumentError, TypeError):
        return id(handle)


def open_xid_source(host: Host, *, use_nvml: bool, nvml: Any = None) -> XidSource:
    """NVML events when `use_nvml` and the GPUs support them, else the node's /dev/kmsg,
    else a source that only sleeps (the agent keeps running; health is then unwatched)."""
    log = structlog.get_logger()
    if use_nvml:
        if nvml is None:
            import pynvml  # type: ignore[import-untyped]

            nvml = pynvml
        try:
            return NvmlXidSource(nvml)
        except nvml.NVMLError as exc:
            log.info("NVML Xid events unavailable: reading the kernel log", detail=str(exc))
    gpus = node_gpus(host)
    if not gpus:
        log.warning("no GPU in sysfs: no kernel log Xid will count",
                    sys_root=str(host.roots.sys), remedy="mount the node's /sys (SYS_ROOT)")
    try:
        return KmsgXidSource(kmsg.open_kmsg(host), gpus)
    except OSError as exc:
        why = f"cannot read {kmsg.kmsg_path(host)}: {exc.strerror or exc}"
        log.warning("GPU health unwatched: no Xid source", detail=why,
                    remedy="mount the node's /dev and grant CAP_SYSLOG (kernel.dmesg_restrict)")
        return NoXidSource(why)
