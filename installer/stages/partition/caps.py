"""MIG capability device nodes: `/dev/nvidia-caps/nvidia-cap<N>`, one per instance.

A process may use a MIG instance only through the capability device of its GPU instance and
of its compute instance; GKE's device plugin reads each instance's `access` file under
`/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access` and mounts the node the
minor names. The driver makes no nodes itself: the minors come from
`/proc/driver/nvidia-caps/mig-minors` (`gpu0/gi1/access 12`, `kmod.mig_minors`), the major
from `/proc/devices` (`nvidia-caps`). Nodes are made by the caller (the load stage's
recorded `ensure_nodes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from installer.node import kmod
from installer.node.host import Host

CAPS_MAJOR_NAME = "nvidia-caps"
CAPABILITIES = Path("driver/nvidia/capabilities")
_MODE_RE = re.compile(r"^DeviceFileMode:\s*(\d+)", re.M)
_MINOR_RE = re.compile(r"^DeviceFileMinor:\s*(\d+)", re.M)
_INSTANCE = re.compile(r"gpu\d+/mig/gi\d+(/ci\d+)?/access")


@dataclass(frozen=True)
class CapNode:
    """One capability node to make: `nvidia-caps/nvidia-cap<minor>` under the dev root."""

    name: str
    major: int
    minor: int
    mode: int


def plan(host: Host) -> list[CapNode]:
    """A node for each instance's access file that exists now, and for MIG config/monitor;
    empty when the driver has no nvidia-caps device (nothing to make)."""
    major = kmod.char_majors(host).get(CAPS_MAJOR_NAME)
    if major is None:
        return []
    minors = kmod.mig_minors(host)
    base = host.roots.proc / CAPABILITIES
    nodes: dict[int, CapNode] = {}
    for relative in [Path("mig/config"), Path("mig/monitor"), *_access_files(host, base)]:
        text = host.read_text(base / relative)
        if text is None:
            continue
        key = relative.name if relative.parent == Path("mig") else _minors_key(relative)
        minor = minors.get(key)
        if minor is None:
            found = _MINOR_RE.search(text)  # an older driver without this table line
            minor = int(found.group(1)) if found else None
        if minor is None:
            continue
        mode = _MODE_RE.search(text)
        nodes[minor] = CapNode(f"nvidia-caps/nvidia-cap{minor}", major, minor,
                               int(mode.group(1)) & 0o777 if mode else 0o444)
    return [nodes[minor] for minor in sorted(nodes)]


def _access_files(host: Host, base: Path) -> list[Path]:
    """`gpu<N>/mig/gi<G>/access` and `.../ci<C>/access`, relative to the capabilities."""
    found = []
    for gpu in host.iterdir(base):
        for gi in host.iterdir(gpu / "mig"):
            if not gi.name.startswith("gi"):
                continue
            found.append(gi.relative_to(base) / "access")
            found.extend(ci.relative_to(base) / "access" for ci in host.iterdir(gi)
                         if ci.name.startswith("ci"))
    return [p for p in found if _INSTANCE.fullmatch(p.as_posix())]


def _minors_key(relative: Path) -> str:
    """`gpu0/mig/gi1/ci0/access` as mig-minors names it: `gpu0/gi1/ci0/access`."""
    parts = [p for p in relative.parts if p != "mig"]
    return "/".join(parts)
