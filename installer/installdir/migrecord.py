"""`.mig.json`: the MIG layout the partition stage left on the node, per GPU.

Written by the partition stage after it applied (or found) the configured layout, removed
when MIG is no longer configured; the signal stage labels the slices and names the MIG
devices in the CDI spec from it (`cdimig`), and `status` shows it, none of them asking
NVML again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from installer.compat.nodelabels import MIG_ATTRIBUTES
from installer.installdir.layout import MIG_RECORD
from installer.node.documents import DocumentError, read_json_file

_MAX_BYTES = 256 * 1024


def read(install_root: Path) -> dict[str, Any] | None:
    """`{"source": ..., "gpus": [{index, name, uuid, memory_mib, pci_bus_id, mig_enabled,
    devices, mig_devices: [{index, uuid, gi, ci, profile, attributes}]}]}` or None
    (absent or unreadable: the node's MIG is not ours to describe)."""
    try:
        data = read_json_file(install_root / MIG_RECORD, limit=_MAX_BYTES)
    except DocumentError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        return None
    return data


def write(install_root: Path, source: str, gpus: list[dict[str, Any]]) -> None:
    from installer.node.host import write_atomic

    body = json.dumps({"source": source, "gpus": gpus}, indent=1) + "\n"
    write_atomic(install_root / MIG_RECORD, body.encode())


def forget(install_root: Path) -> None:
    (install_root / MIG_RECORD).unlink(missing_ok=True)


def attributes(gpu: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per profile, the NVML figures recorded for one of its MIG devices (whole numbers
    from 0 only: a doctored record labels nothing it cannot)."""
    found: dict[str, dict[str, int]] = {}
    for device in gpu.get("mig_devices") or []:
        if not isinstance(device, dict) or not isinstance(device.get("profile"), str):
            continue
        figures = device.get("attributes")
        if isinstance(figures, dict) and figures and all(
                k in MIG_ATTRIBUTES and type(v) is int and 0 <= v < 1 << 40
                for k, v in figures.items()):
            found.setdefault(device["profile"], figures)
    return found


def describe(gpu: dict[str, Any]) -> str:
    """One GPU's row as `MIG 7x1g.5gb`, `MIG on, no instances` or `MIG off`."""
    if not gpu.get("mig_enabled"):
        return "MIG off"
    parts = [f"{count}x{name}" for name, count in gpu.get("devices") or []]
    return "MIG " + (", ".join(parts) if parts else "on, no instances")
