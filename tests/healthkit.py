"""What the GPU health tests share: kernel log records as /dev/kmsg hands them out, a host
tree with a boot ID, a FIFO standing in for /dev/kmsg, a fake Node, a recording logger."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubefake
from kubefake import Cluster, node_doc

from installer.agent.health import Xid
from installer.node import kube
from installer.node.host import RealHost, Roots

NODE = "gpu-node-1"
BOOT = "6f1e0c56-0d0f-4b1e-9d53-0f0a4b1c2d3e"
REBOOTED = "b3a1d0e2-7c44-4c2a-8f61-3e5d9a0b1c2f"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python3, GPU has fallen off the bus."
XID48_OLD = ("NVRM: Xid (0000:00:1E): 48, An uncorrectable double bit error (DBE) has been "
             "detected on GPU in the framebuffer at partition 0, subpartition 0.")
XID13 = ("NVRM: Xid (PCI:0000:b1:00): 13, pid='<unknown>', name=<unknown>, Graphics "
         "Exception: ESR 0x514730=0x201000e 0x514734=0x20")


def record(seq: int, message: str, *, prio: int = 3, dictionary: tuple[str, ...] = ()) -> bytes:
    """One /dev/kmsg record as read() returns it: header;message, then ' KEY=value' lines."""
    lines = [f"{prio},{seq},{seq * 1000 + 17},-;{message}", *(f" {d}" for d in dictionary)]
    return ("\n".join(lines) + "\n").encode()


# The GPUs the host tree's sysfs lists: an Xid line counts only for one of them.
GPU_ADDRESSES = ("0000:3b:00.0", "0000:b1:00.0", "0000:00:1e.0")


def add_gpus(root: Path, addresses: tuple[str, ...] = GPU_ADDRESSES) -> None:
    """NVIDIA GPUs (class 0x0302) under <root>/sys/bus/pci/devices, as sysfs lists them."""
    for address in addresses:
        device = root / "sys/bus/pci/devices" / address
        device.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", "0x10de"), ("device", "0x20b0"), ("class", "0x030200")):
            (device / name).write_text(value + "\n")


def host_tree(tmp_path: Path, gpus: tuple[str, ...] = GPU_ADDRESSES) -> RealHost:
    for name in ("proc/sys/kernel/random", "sys", "dev"):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    add_gpus(tmp_path, gpus)
    return RealHost(Roots(tmp_path, tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"))


@contextlib.contextmanager
def fifo_log(tmp_path: Path) -> Iterator[tuple[RealHost, int]]:
    """A host whose /dev/kmsg is a FIFO, and the writer's descriptor (open while the test
    runs, so an empty log blocks the reader as the real device does)."""
    host = host_tree(tmp_path)
    os.mkfifo(tmp_path / "dev/kmsg")
    reader = os.open(tmp_path / "dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open
    writer = os.open(tmp_path / "dev/kmsg", os.O_WRONLY)
    os.close(reader)
    try:
        yield host, writer
    finally:
        os.close(writer)


class Log:
    """A structlog-shaped logger that records (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))


def fake_cluster() -> Cluster:
    node = node_doc(NODE)
    node["status"] = {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-12-02T03:00:00Z",
        "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
    return Cluster(node_name=NODE, nodes={NODE: node})


def api_for(url: str, tmp_path: Path) -> kube.ApiServer:
    token = tmp_path / "token"
    token.write_text(kubefake.TOKEN + "\n")
    return kube.ApiServer(url, token, None)


class StaticSource:
    """Gives the same Xids on every wait."""

    kind = "static"

    def __init__(self, xids: list[Xid]) -> None:
        self.xids = xids

    def wait(self, timeout_s: float) -> list[Xid]:
        return list(self.xids)

    def close(self) -> None:
        pass
