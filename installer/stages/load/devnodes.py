"""Device nodes for the loaded NVIDIA driver on the host's /dev, numbered as the driver says.

The driver itself creates no nodes (udev rules or nvidia-modprobe normally do), and GKE's
device plugin takes the appearance of `/dev/nvidia-uvm` as "the driver is ready", so the
uvm nodes are always made last. Every node also gets a `/dev/char/MAJ:MIN` link: without
it, containers lose the GPU after `systemctl daemon-reload` re-applies device cgroups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from installer.node import kmod
from installer.node.host import Host

NVIDIA_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
NODE_MODE = 0o666
_FRONTEND_NAMES = ("nvidia-frontend", "nvidia")
_MINOR_RE = re.compile(r"^Device Minor:\s*(\d+)", re.M)
_CAP_MINOR_RE = re.compile(r"^DeviceFileMinor:\s*(\d+)", re.M)
_CAP_MODE_RE = re.compile(r"^DeviceFileMode:\s*(\d+)", re.M)


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


def plan(host: Host) -> list[DeviceNode]:
    """Every node the loaded modules call for, in creation order (uvm last)."""
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
    if "nvidia-uvm" in majors:
        uvm = majors["nvidia-uvm"]
        nodes.append(DeviceNode("nvidia-uvm-tools", uvm, 1))
        nodes.append(DeviceNode("nvidia-uvm", uvm, 0))
    return nodes


def ensure_nodes(host: Host, nodes: list[DeviceNode]) -> NodesResult:
    """Make each node and its /dev/char link; keep correct ones, replace wrong ones."""
    result = NodesResult()
    dev = host.roots.dev
    for node in nodes:
        path = dev / node.name
        current = host.char_device(path)
        wanted = (node.major, node.minor, node.mode)
        if current == wanted:
            result.kept.append(node.name)
        else:
            existed = current is not None or path.exists() or path.is_symlink()
            host.mknod_char(path, node.major, node.minor, node.mode)
            (result.replaced if existed else result.created).append(node.name)
        _ensure_char_link(host, dev, node)
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
