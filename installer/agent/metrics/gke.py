"""GKE's GPU metric names, labels and help texts: the one table the drop-in family renders.

Provenance: GKE's device plugin with `--enable-container-gpu-metrics`,
GoogleCloudPlatform/container-engine-accelerators `pkg/gpu/nvidia/metrics/metrics.go` at
992db81257553607f1477945f1b3219632991829 (the file last changed in 34efc30b, 2023-04-26).
Its node series carry `make, accelerator_id, model` since ad03df52 (2022-05-31), which
dropped `node_name` (8497d7d1; the node is the scrape's target label instead); the
`accelerator_index` of 2cbc6fdc (2022-02-09) was reverted the same day (5312a754).

What the values and labels mean there (`updateMetrics`, `getGpuMetricsInfo`), and here:
every family is a gauge; `make` is "nvidia"; `accelerator_id` is the GPU's UUID (NVML's
`GetUUID`), `model` its NVML name; `duty_cycle*` is the percentage (0-100) of NVML's
utilisation samples, `memory_*` NVML's memory info in bytes; `request` is the number of
`nvidia.com/gpu` devices the kubelet assigned to the container (`resource_name` that name).
The agent adds one label of its own, `attribution`, to the per-container GPU series, and
serves `request` for the other GPU resources too (`attribution.is_gpu_resource`).
"""

from __future__ import annotations

CONTAINER_LABELS = ("namespace", "pod", "container", "make", "accelerator_id", "model")
NODE_LABELS = ("make", "accelerator_id", "model")
REQUEST_LABELS = ("namespace", "pod", "container", "resource_name")
MAKE = "nvidia"
GPU_RESOURCE = "nvidia.com/gpu"

_BUSY = "Percent of time when the GPU was actively processing"
_TOTAL = "Total memory available on the GPU in bytes"
_USED = "Allocated GPU memory in bytes"

# name -> (help, labels), as metrics.go declares them
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "duty_cycle_gpu_node": (_BUSY, NODE_LABELS),
    "memory_total_gpu_node": (_TOTAL, NODE_LABELS),
    "memory_used_gpu_node": (_USED, NODE_LABELS),
    "duty_cycle": (_BUSY, CONTAINER_LABELS),
    "memory_total": (_TOTAL, CONTAINER_LABELS),
    "memory_used": (_USED, CONTAINER_LABELS),
    "request": ("Number of accelerator devices requested by the container", REQUEST_LABELS),
}
