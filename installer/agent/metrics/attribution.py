"""Which GPU a container's device names, and whether the container has that GPU alone.

Device ids map to GPUs as dcgm-exporter maps them (NVIDIA/dcgm-exporter
`internal/pkg/transformation/kubernetes.go` at d5e5f510a1b6b393f39a43293ccd9dc985defc79:
`iterateGPUDevices`, `getSharedGPU`, `stripVGPUSuffix`, `gkeMigDeviceIDRegex`,
`toDeviceToSharingPods`):

- `GPU-<uuid>` (NVIDIA's device plugin), `nvidia<minor>` (GKE's), a plain index: the whole
  GPU, `exact`;
- `<id>::<n>` (NVIDIA's plugin sharing a GPU by time-slicing or MPS: replica n): the GPU of
  `<id>`, `shared`;
- `nvidia<minor>/vgpu<n>` (GKE's GPU time-sharing): GPU nvidia<minor>, `shared`;
- `nvidia<minor>/gi<g>[/vgpu<n>]` (GKE's MIG partitions): GPU nvidia<minor>, `shared`;
- `MIG-<uuid>[::<n>]` (NVIDIA's plugin, MIG strategy single or mixed): the GPU NVML lists
  that MIG device under, `shared`;
- a DRA device of NVIDIA's driver (`gpu.nvidia.com`), by claim and device: `gpu-<minor>`
  (the whole GPU: `exact`, or `shared` when its allocation carries a share id) or
  `gpu-<minor>-mig-...` (a MIG device of that GPU: `shared`). Those are the driver's
  canonical names (NVIDIA/k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/deviceinfo.go` and
  `mig.go` at 22407113785e78c7763b4637689a201eb39c6199); dcgm-exporter looks the device's
  UUID up in the API server's ResourceSlices instead (`toDeviceToPodsDRA`), which the
  agent's metrics do not read.

A MIG device is `shared` for the GPU-wide readings, but its own GPU instance's GPM activity
belongs to the container when the container holds the instance alone (`mig_holdings`): a
`MIG-<uuid>` id without a replica suffix, or GKE's `nvidia<minor>/gi<g>`, naming a GPU
instance with one compute instance (one MIG device) that no other container holds. DRA's
MIG device names carry no GPU instance id, so they get no instance series.

`shared` means the GPU-wide readings served for the container (duty cycle, memory) are the
whole GPU's, which other containers or MIG instances use too: NVML gives no split per
container. `exact` means the container holds the whole GPU alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from installer.agent.metrics.snapshot import GpuReading, Snapshot
from installer.node.podresources import ClaimDevice, ContainerDevices

EXACT, SHARED = "exact", "shared"
DRA_GPU_DRIVER = "gpu.nvidia.com"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")  # the plugins' GPU resources
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # NVIDIA's plugin, mixed strategy
_GKE_MIG = re.compile(r"^(nvidia[0-9]+)/gi[0-9]+(/vgpu[0-9]+)?$")
_GKE_VGPU = "/vgpu"
_DRA_NAME = re.compile(r"^gpu-([0-9]+)(-mig-.+)?$")
_GKE_GI = re.compile(r"^(nvidia[0-9]+)/gi([0-9]+)$")
_OLD_MIG = re.compile(r"^MIG-(GPU-[^/]+)/([0-9]+)/[0-9]+$")

Attributed = tuple[GpuReading, str]  # (the GPU, EXACT or SHARED)
Holder = tuple[str, str, str]  # (namespace, pod, container)


def is_gpu_resource(resource: str) -> bool:
    """A device plugin resource whose devices are NVIDIA GPUs or parts of them."""
    return resource in GPU_RESOURCES or resource.startswith(MIG_RESOURCE_PREFIX)


def plugin_device(device_id: str, names: Mapping[str, GpuReading]) -> Attributed | None:
    """The GPU a device plugin's id names (`names`: each GPU's `device_ids()`), or None."""
    base, replica, _ = device_id.partition("::")
    shared = bool(replica)
    gke_mig = _GKE_MIG.match(base)
    if gke_mig:
        base, shared = gke_mig.group(1), True
    elif _GKE_VGPU in base:
        base, shared = base.split(_GKE_VGPU)[0], True
    elif base.startswith("MIG-"):
        shared = True
        if base.startswith("MIG-GPU-"):  # drivers before R470: MIG-GPU-<uuid>/<gi>/<ci>
            base = base[len("MIG-"):].split("/")[0]
    gpu = names.get(base)
    return None if gpu is None else (gpu, SHARED if shared else EXACT)


def claim_device(device: ClaimDevice, minors: Mapping[int, GpuReading]) -> Attributed | None:
    """The GPU a DRA device of NVIDIA's driver is, or is part of (`minors`: GPUs by
    /dev/nvidia<minor>); None for other drivers and names."""
    named = _DRA_NAME.match(device.device) if device.driver == DRA_GPU_DRIVER else None
    gpu = minors.get(int(named.group(1))) if named else None
    if named is None or gpu is None:
        return None
    shared = named.group(2) is not None or device.share_id is not None
    return gpu, SHARED if shared else EXACT


def holdings(snap: Snapshot) -> dict[Holder, dict[str, Attributed]]:
    """Each container's GPUs (by UUID), through device plugins and DRA claims alike: a GPU
    reached both exactly and shared is shared; an id that names no GPU read this pass is
    left out (it still counts in `request`)."""
    names = {name: gpu for gpu in snap.gpus for name in gpu.device_ids()}
    found: dict[Holder, dict[str, Attributed]] = {}
    reached: list[tuple[Holder, Attributed | None]] = []
    for row in snap.containers or ():
        if isinstance(row, ContainerDevices) and is_gpu_resource(row.resource):
            holder = (row.namespace, row.pod, row.container)
            reached += [(holder, plugin_device(d, names)) for d in row.device_ids]
    reached += [((d.namespace, d.pod, d.container), a) for d, a in claimed(snap)]
    for holder, attributed in reached:
        gpus = found.setdefault(holder, {})
        before = gpus.get(attributed[0].uuid) if attributed is not None else None
        if attributed is not None and (before is None or before[1] != SHARED):
            gpus[attributed[0].uuid] = attributed
    return found


def gpu_holders(snap: Snapshot) -> dict[str, list[Holder]]:
    """The containers holding each GPU (by UUID), in order."""
    found: dict[str, list[Holder]] = {}
    for holder, gpus in sorted(holdings(snap).items()):
        for uuid in gpus:
            found.setdefault(uuid, []).append(holder)
    return found


def claimed(snap: Snapshot) -> list[tuple[ClaimDevice, Attributed]]:
    """DRA devices of NVIDIA's driver that name a GPU read this pass."""
    minors = {gpu.device_minor: gpu for gpu in snap.gpus}
    found = []
    for row in snap.containers or ():
        if isinstance(row, ClaimDevice):
            attributed = claim_device(row, minors)
            if attributed is not None:
                found.append((row, attributed))
    return found


Instance = tuple[GpuReading, int, str]  # (the GPU, GPU instance id, the MIG device's UUID)


def mig_holdings(snap: Snapshot) -> dict[Holder, list[Instance]]:
    """The MIG GPU instances each container holds alone (see the module's docstring)."""
    names = {name: gpu for gpu in snap.gpus for name in gpu.device_ids()[:3]}
    by_uuid = {uuid: (gpu, gi) for gpu in snap.gpus for uuid, gi in gpu.mig_instances.items()}
    holders: dict[tuple[str, int], set[Holder]] = {}
    held: dict[Holder, dict[tuple[str, int], Instance]] = {}
    for row in snap.containers or ():
        if not (isinstance(row, ContainerDevices) and is_gpu_resource(row.resource)):
            continue
        holder = (row.namespace, row.pod, row.container)
        for device_id in row.device_ids:
            instance = _instance(device_id, names, by_uuid)
            if instance is not None:
                key = (instance[0].uuid, instance[1])
                holders.setdefault(key, set()).add(holder)
                if "::" not in device_id:
                    held.setdefault(holder, {})[key] = instance
    return {holder: [i for key, i in sorted(found.items()) if len(holders[key]) == 1]
            for holder, found in sorted(held.items())}


def _instance(device_id: str, names: Mapping[str, GpuReading],
              by_uuid: Mapping[str, tuple[GpuReading, int]]) -> Instance | None:
    """The GPU instance a plugin's MIG id names, when that instance has one MIG device."""
    base = device_id.partition("::")[0]
    named = _GKE_GI.match(base) or _OLD_MIG.match(base)
    if base in by_uuid:
        gpu, gi = by_uuid[base]
    elif named is not None and named.group(1) in names:
        gpu, gi = names[named.group(1)], int(named.group(2))
    else:
        return None
    devices = [uuid for uuid, its in gpu.mig_instances.items() if its == gi]
    return (gpu, gi, devices[0]) if len(devices) == 1 else None
