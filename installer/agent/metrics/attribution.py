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

`shared` means the GPU-wide readings served for the container (duty cycle, memory) are the
whole GPU's, which other containers or MIG instances use too: NVML gives no split per
container. `exact` means the container holds the whole GPU alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from installer.agent.metrics.snapshot import GpuReading
from installer.node.podresources import ClaimDevice

EXACT, SHARED = "exact", "shared"
DRA_GPU_DRIVER = "gpu.nvidia.com"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")  # the plugins' GPU resources
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # NVIDIA's plugin, mixed strategy
_GKE_MIG = re.compile(r"^(nvidia[0-9]+)/gi[0-9]+(/vgpu[0-9]+)?$")
_GKE_VGPU = "/vgpu"
_DRA_NAME = re.compile(r"^gpu-([0-9]+)(-mig-.+)?$")

Attributed = tuple[GpuReading, str]  # (the GPU, EXACT or SHARED)


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
