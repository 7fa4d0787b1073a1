"""MIG devices in the CDI spec: what the partition stage left (`.mig.json`), as CDI devices.

Named as NVIDIA's `nvidia-ctk cdi generate` names them, so a workload asks for the same
name either way: `nvidia.com/gpu=<gpu index>:<MIG index>` (NVML's MIG device index under
its GPU) and `nvidia.com/gpu=MIG-<uuid>`. Each carries what a process needs to use exactly
that instance: its GPU's `/dev/nvidia<minor>` and the access capability nodes of its GPU
instance and of its compute instance (`/dev/nvidia-caps/nvidia-cap<N>`, N from the driver's
`/proc/driver/nvidia-caps/mig-minors`), with the numbers the node's /dev has now. Never the
MIG `config` and `monitor` caps (those repartition or watch every GPU).

A GPU in MIG mode is not offered whole: `/dev/nvidia<minor>` alone reaches no instance, and
a name for it would read as the whole GPU. An instance whose nodes are not on /dev (made by
the partition stage) is left out rather than offered without them; one whose UUID is not
of the `MIG-<uuid>` form is named by index only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from installer.installdir import cdi, migrecord
from installer.node.host import Host
from installer.node.kmod import mig_minors
from installer.node.pci import bus_key

# NVIDIA's MIG UUID (`MIG-<uuid>`); an R450-era `MIG-GPU-<uuid>/<gi>/<ci>` is no CDI name
_MIG_UUID = re.compile(r"MIG-[0-9A-Fa-f][0-9A-Fa-f-]{0,63}")


def node_spec(host: Host, install_dir: PurePosixPath, version: str,
              gpus: Sequence[cdi.CdiGpu]) -> cdi.Spec | None:
    """`cdi.node_spec` with the MIG layout the partition stage recorded: the GPUs in MIG
    mode leave the whole-GPU devices and their instances join as MIG devices."""
    record = migrecord.read(host.roots.node(install_dir))
    rows = _mig_rows(record, gpus)
    if not rows:
        return cdi.node_spec(host, install_dir, version, gpus)
    whole = [g for g in gpus if g.uuid not in rows]
    extra = devices(host, [(gpu, rows[gpu.uuid]) for gpu in gpus if gpu.uuid in rows])
    return cdi.node_spec(host, install_dir, version, whole, extra_devices=extra)


def _mig_rows(record: dict[str, Any] | None, gpus: Sequence[cdi.CdiGpu]
              ) -> dict[str, list[dict[str, Any]]]:
    """GPU UUID -> its recorded MIG devices, for each verified GPU the record says is in
    MIG mode (a row naming no GPU of ours is ignored)."""
    ours = {g.uuid for g in gpus}
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in (record or {}).get("gpus", []):
        if isinstance(row, dict) and row.get("mig_enabled") and row.get("uuid") in ours:
            found = row.get("mig_devices")
            rows[str(row["uuid"])] = [d for d in found if _well_formed(d)] if isinstance(
                found, list) else []
    return rows


def _well_formed(device: object) -> bool:
    """A record entry we can name: whole numbers from 0 for the index and the ids."""
    return isinstance(device, dict) and all(
        type(device.get(k)) is int and device[k] >= 0 for k in ("index", "gi", "ci"))


def devices(host: Host, gpus: Sequence[tuple[cdi.CdiGpu, list[dict[str, Any]]]]
            ) -> list[dict[str, Any]]:
    """The CDI device entries of these GPUs' MIG devices (by index name, then UUID)."""
    minors = cdi.gpu_minors(host)
    table = mig_minors(host)
    entries: list[dict[str, Any]] = []
    named: set[str] = set()  # a doctored record's repeated name would void the whole spec
    for gpu, migs in gpus:
        minor = minors.get(bus_key(gpu.pci_bus_id), gpu.index)
        parent = cdi.dev_node(host, f"nvidia{minor}")
        for mig in sorted(migs, key=lambda m: int(m["index"])):
            nodes = [parent, *(_cap(host, table, key) for key in _cap_keys(minor, mig))]
            names = [f"{gpu.index}:{mig['index']}"]
            if _MIG_UUID.fullmatch(str(mig.get("uuid", ""))):
                names.append(str(mig["uuid"]))
            if any(node is None for node in nodes) or named & set(names):
                continue
            named.update(names)
            edits = {"deviceNodes": [n.entry() for n in nodes if n is not None]}
            entries += [{"name": name, "containerEdits": edits} for name in names]
    return entries


def _cap_keys(minor: int, mig: dict[str, Any]) -> tuple[str, str]:
    """mig-minors' names of the GPU instance's and the compute instance's access caps."""
    gi = f"gpu{minor}/gi{mig['gi']}"
    return f"{gi}/access", f"{gi}/ci{mig['ci']}/access"


def _cap(host: Host, table: dict[str, int], key: str) -> cdi.Node | None:
    number = table.get(key)
    return None if number is None else cdi.dev_node(host, f"nvidia-caps/nvidia-cap{number}")

