"""Device nodes for the loaded NVIDIA driver on the host's /dev, numbered as the driver says.

The driver itself creates no nodes (udev rules or nvidia-modprobe normally do), and GKE's
device plugin takes the appearance of `/dev/nvidia-uvm` as "the driver is ready", so the
uvm nodes are always made last. Every node also gets a `/dev/char/MAJ:MIN` link: without
it, containers lose the GPU after `systemctl daemon-reload` re-applies device cgroups.

Which nodes the installer made is recorded (`.devnodes.json` in the install dir: name,
numbers, inode, and the boot they belong to), so that a live upgrade can withdraw the
nodes GKE's device plugin waits for (its "gate": it polls `stat /dev/nvidiactl` and
`/dev/nvidia-uvm` every 5 s before it opens NVML) without ever deleting a node someone
else made, and the load stage can hold them back until the new driver is verified.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from installer.errors import InstallerError
from installer.node import kmod
from installer.node.documents import read_document
from installer.node.host import Host, write_atomic

NVIDIA_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
NODE_MODE = 0o666
_FRONTEND_NAMES = ("nvidia-frontend", "nvidia")
_MINOR_RE = re.compile(r"^Device Minor:\s*(\d+)", re.M)
_CAP_MINOR_RE = re.compile(r"^DeviceFileMinor:\s*(\d+)", re.M)
_CAP_MODE_RE = re.compile(r"^DeviceFileMode:\s*(\d+)", re.M)
# What GKE's device plugin stats before it opens NVML (nvidiactl, nvidia-uvm), and the uvm
# tools node that goes with it; also what NVML itself opens first, so a client without
# CAP_MKNOD cannot start while they are withdrawn. In creation order (uvm last).
GATE = ("nvidiactl", "nvidia-uvm-tools", "nvidia-uvm")
IMEX_CHANNELS = kmod.IMEX_CHANNELS  # channel0: the default one of an IMEX domain
_MAX_RECORD_BYTES = 64 * 1024
# major, minor, inode, ctime (ns): "the node we made is still there, untouched"
Identity = tuple[int, int, int, int]


@dataclass(frozen=True)
class DeviceNode:
    """One character device node, as a path relative to the dev root."""

    name: str
    major: int
    minor: int
    mode: int = NODE_MODE

    @property
    def char_link(self) -> str:
        return f"char/{self.major}:{self.minor}"


@dataclass
class NodesResult:
    """What ensure_nodes did, by node name."""

    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # absent and held back (an upgrade's gate)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.replaced)


def gpu_minors(host: Host) -> list[int]:
    """The driver's own minor numbers for each GPU (`Device Minor:` in gpus/*/information)."""
    gpus_dir = host.roots.proc / "driver" / "nvidia" / "gpus"
    minors = []
    for gpu in host.iterdir(gpus_dir):
        match = _MINOR_RE.search(host.read_text(gpu / "information") or "")
        if match:
            minors.append(int(match.group(1)))
    return sorted(set(minors))


def cap_nodes(host: Host, caps_major: int) -> list[DeviceNode]:
    """nvidia-caps/nvidia-capN for each capability file the driver publishes (MIG)."""
    nodes: dict[int, DeviceNode] = {}
    stack = [host.roots.proc / "driver" / "nvidia" / "capabilities"]
    while stack:
        for entry in host.iterdir(stack.pop()):
            if entry.is_dir():
                stack.append(entry)
                continue
            text = host.read_text(entry) or ""
            minor = _CAP_MINOR_RE.search(text)
            mode = _CAP_MODE_RE.search(text)
            if minor:
                number = int(minor.group(1))
                perm = int(mode.group(1)) & 0o777 if mode else 0o444
                nodes[number] = DeviceNode(f"nvidia-caps/nvidia-cap{number}", caps_major,
                                           number, perm)
    return [nodes[minor] for minor in sorted(nodes)]


def plan(host: Host, *, imex_channel: bool = False) -> list[DeviceNode]:
    """Every node the loaded modules call for, in creation order (uvm last); with
    `imex_channel` (IMEX=host) also IMEX's default channel, where the driver has the device
    (the DRA driver makes its own per workload: a default channel would bypass it)."""
    majors = kmod.char_majors(host)
    frontend = next((majors[n] for n in _FRONTEND_NAMES if n in majors), None)
    nodes: list[DeviceNode] = []
    if frontend is not None:
        nodes.append(DeviceNode("nvidiactl", frontend, CTL_MINOR))
        nodes.extend(DeviceNode(f"nvidia{m}", frontend, m) for m in gpu_minors(host))
        if kmod.module_state(host, "nvidia_modeset") is not None:
            nodes.append(DeviceNode("nvidia-modeset", frontend, MODESET_MINOR))
    if "nvidia-caps" in majors:
        nodes.extend(cap_nodes(host, majors["nvidia-caps"]))
    if imex_channel and IMEX_CHANNELS in majors:
        nodes.append(DeviceNode(f"{IMEX_CHANNELS}/channel0", majors[IMEX_CHANNELS], 0))
    if "nvidia-uvm" in majors:
        uvm = majors["nvidia-uvm"]
        nodes.append(DeviceNode("nvidia-uvm-tools", uvm, 1))
        nodes.append(DeviceNode("nvidia-uvm", uvm, 0))
    return nodes


def ensure_nodes(host: Host, nodes: list[DeviceNode], *, hold: Collection[str] = (),
                 record: Path | None = None) -> NodesResult:
    """Make each node and its /dev/char link; keep correct ones, replace wrong ones.

    A node named in `hold` is not made while it is absent (an upgrade holds GKE's device
    plugin at its gate until the new driver is verified). With `record`, the nodes made
    here are recorded as ours; a kept node stays ours only if it is the one we made."""
    result = NodesResult()
    dev = host.roots.dev
    owned = read_record(host, record) if record is not None else {}
    for node in nodes:
        path = dev / node.name
        current = host.char_device(path)
        wanted = (node.major, node.minor, node.mode)
        if current is None and node.name in hold and not path.is_symlink():
            result.held.append(node.name)
            continue
        if current == wanted:
            result.kept.append(node.name)
        else:
            existed = current is not None or path.exists() or path.is_symlink()
            host.mknod_char(path, node.major, node.minor, node.mode)
            (result.replaced if existed else result.created).append(node.name)
            owned[node.name] = _identity(host, path) or (node.major, node.minor, -1, -1)
        _ensure_char_link(host, dev, node)
    if record is not None:
        _write_record(host, record, owned)
    return result


def _ensure_char_link(host: Host, dev: Path, node: DeviceNode) -> None:
    """`/dev/char/195:255 -> ../nvidiactl`, relative so it resolves in any mount of /dev."""
    link = dev / node.char_link
    target = str(PurePosixPath("..") / node.name)
    if host.readlink(link) != target:
        host.symlink(target, link)


def remove_uvm_nodes(host: Host) -> list[str]:
    """Before unloading: take away the 'ready' signal the device plugin watches."""
    removed = []
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        path = host.roots.dev / name
        if host.char_device(path) is not None:
            path.unlink()
            removed.append(name)
    return removed


def withdraw(host: Host, record: Path, names: Collection[str] = GATE) -> list[str]:
    """Remove those of `names` that are still the nodes this installer made (same boot,
    numbers, inode and change time) and their /dev/char links; a node someone else made
    (or changed) stays."""
    owned = read_record(host, record)
    removed = []
    for name in names:
        path = host.roots.dev / name
        recorded = owned.get(name)
        if recorded is None or _identity(host, path) != recorded:
            continue
        path.unlink()
        link = host.roots.dev / "char" / f"{recorded[0]}:{recorded[1]}"
        if host.readlink(link) == str(PurePosixPath("..") / name):
            link.unlink()
        del owned[name]
        removed.append(name)
    if removed:
        _write_record(host, record, owned)
    return removed


def read_record(host: Host, record: Path) -> dict[str, Identity]:
    """The nodes this installer made in this boot (none when the record is from another
    boot, absent or unreadable: then nothing counts as ours)."""
    try:
        data = read_document(host.read_bytes(record, _MAX_RECORD_BYTES + 1) or b"{}",
                             name=str(record), limit=_MAX_RECORD_BYTES)
    except (InstallerError, OSError):  # malformed, or not a regular file
        return {}
    if not isinstance(data, dict) or data.get("boot_id") != _boot_id(host):
        return {}
    nodes = data.get("nodes")
    if not isinstance(nodes, dict):
        return {}
    return {str(name): (ident[0], ident[1], ident[2], ident[3])
            for name, ident in nodes.items() if isinstance(ident, list) and len(ident) == 4
            and all(isinstance(n, int) and not isinstance(n, bool) for n in ident)}


def _write_record(host: Host, record: Path, owned: dict[str, Identity]) -> None:
    """Only nodes still there as we made them: a later reader must never delete another's."""
    still = {name: list(ident) for name, ident in sorted(owned.items())
             if _identity(host, host.roots.dev / name) == ident}
    body = {"boot_id": _boot_id(host), "nodes": still}
    write_atomic(record, (json.dumps(body, indent=1) + "\n").encode())


def _identity(host: Host, path: Path) -> Identity | None:
    numbers = host.char_device(path)
    if numbers is None:
        return None
    try:
        info = path.lstat()
    except OSError:
        return None
    return numbers[0], numbers[1], info.st_ino, info.st_ctime_ns


def _boot_id(host: Host) -> str:
    """The kernel's boot id: /dev is new after a reboot, and so is ownership of its nodes."""
    return (host.read_text(host.roots.proc / "sys/kernel/random/boot_id") or "").strip()
