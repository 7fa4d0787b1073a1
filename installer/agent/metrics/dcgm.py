"""dcgm-exporter's names for the GPU readings (METRICS_DCGM_NAMES): the one table of names,
types and units, and the family it renders from NVML.

Provenance: NVIDIA/dcgm-exporter `etc/default-counters.csv` at
d5e5f510a1b6b393f39a43293ccd9dc985defc79 (the file last changed in e61056b9, 2025-12-04):
each field's name, its Prometheus type (`label`: a label on every other series, not a
series), and its unit as the file's help text states it (none stated: ""). The help texts
below are ours. The labels are those of `internal/pkg/rendermetrics/render_metrics.go`
(`gpuMetricsFormat`) in release 4.5.3-4.8.2 (691c92762eb551313c825f6efe4ceeee20982801):
`gpu` (the index), `UUID`, `pci_bus_id`, `device` (`nvidia<index>`), `modelName`,
`Hostname` (the node's name; left out where the agent knows none), each
label field by its field name, and `namespace, pod, container` from the pod mapping
(`internal/pkg/transformation/kubernetes.go`, `const.go`). dcgm-exporter's main branch
renamed `Hostname` to `hostname` after that release (d5e5f510, #655); dashboards written for
the releases use `Hostname`, which is served.

The values come from NVML, as DCGM's fields do: `GPU_UTIL` the duty cycle in percent,
`FB_*` the v2 memory info in whole MiB (total = used + free + reserved), `XID_ERRORS` the
number of the GPU's last Xid since the agent started (0 before any), the remapped-row
counts and failure flag from nvmlDeviceGetRemappedRows, the profiling (`DCGM_FI_PROF_*`)
ratios from NVML's GPU Performance Monitoring (gpm.py) of the whole GPU where it has GPM
(Hopper and later; no GPU with GPM, or GPM off: no profiling family at all). The file's DCP
rows that GPM measures are served: GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE and DRAM_ACTIVE
(active there), SM_ACTIVE and SM_OCCUPANCY (commented out there, the usual opt-ins for
autoscaling on SM activity). Each GPU has one series per field,
as in dcgm-exporter's default mapping (without `--kubernetes-virtual-gpus`), so a dashboard's
`sum` or `avg` over GPUs counts each GPU once: its pod labels name the container holding it
when exactly one does, and are empty when none does or several share it (dcgm-exporter then
names one of them, whichever its map kept; the per-container view of a shared GPU is
`duty_cycle{attribution="shared"}`). Counters are named without `_total`, as dcgm-exporter
names them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

from installer.agent.metrics.snapshot import GpuReading, Snapshot
from installer.agent.xids import pci_name

MIB = 1024 * 1024
GAUGE, COUNTER, LABEL = "gauge", "counter", "label"
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
POD_LABELS = ("namespace", "pod", "container")
DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"
OPTIONAL = frozenset(("Hostname",))  # left out when empty
Holder = tuple[str, str, str]  # (namespace, pod, container)


@dataclass(frozen=True)
class Field:
    """One field of default-counters.csv: its name, type and unit there; our help text."""

    name: str
    kind: str  # GAUGE, COUNTER or LABEL
    unit: str  # as the file's help text gives it ("" where it gives none)
    doc: str
    default: bool = True  # False: the file has the row commented out (an opt-in)


FIELDS = (
    Field("DCGM_FI_DEV_GPU_UTIL", GAUGE, "%", "GPU duty cycle in percent (NVML "
          "utilisation samples)"),
    Field("DCGM_FI_DEV_FB_USED", GAUGE, "MiB", "GPU memory allocated, reserved memory "
          "excluded, in MiB"),
    Field("DCGM_FI_DEV_FB_FREE", GAUGE, "MiB", "GPU memory unallocated, in MiB"),
    Field("DCGM_FI_DEV_FB_RESERVED", GAUGE, "MiB", "GPU memory the driver and firmware "
          "set aside, in MiB"),
    Field("DCGM_FI_DEV_GPU_TEMP", GAUGE, "C", "GPU core temperature in degrees Celsius"),
    Field("DCGM_FI_DEV_POWER_USAGE", GAUGE, "W", "GPU power draw in watts"),
    Field("DCGM_FI_DEV_XID_ERRORS", GAUGE, "", "The number of the GPU's last Xid since "
          "the agent started (0: none)"),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", COUNTER, "", "Memory rows remapped "
          "after uncorrectable errors"),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", COUNTER, "", "Memory rows remapped after "
          "correctable errors"),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", GAUGE, "", "1 when remapping a memory row "
          "failed"),
    Field(DRIVER_VERSION, LABEL, "", "The driver version (NVML), a label on every series"),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", GAUGE, "ratio", "Ratio of time any graphics or "
          "compute engine was active (NVML GPM GRAPHICS_UTIL)"),
    Field("DCGM_FI_PROF_SM_ACTIVE", GAUGE, "ratio", "Ratio of cycles an SM has at least one "
          "warp assigned (NVML GPM SM_UTIL)", default=False),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", GAUGE, "ratio", "Ratio of warps resident on the SMs "
          "to the most they hold (NVML GPM SM_OCCUPANCY)", default=False),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", GAUGE, "ratio", "Ratio of cycles any tensor "
          "pipe was active (NVML GPM ANY_TENSOR_UTIL)"),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", GAUGE, "ratio", "Ratio of DRAM bandwidth used to its "
          "peak (NVML GPM DRAM_BW_UTIL)"),
)
# the profiling fields: field -> its GPM metric (gpm.METRICS), a percentage served as a ratio
PROFILING = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": "graphics_active",
             "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
             "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
             "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
             "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active"}
COUNTERS = frozenset(f.name for f in FIELDS if f.kind == COUNTER)


def _util(gpu: GpuReading, snap: Snapshot) -> float | None:
    return gpu.duty_cycle


def _used(gpu: GpuReading, snap: Snapshot) -> float | None:
    if gpu.memory_used is None:
        return None
    return float((gpu.memory_used - (gpu.memory_reserved or 0)) // MIB)


def _mib(value: int | None) -> float | None:
    return None if value is None else float(value // MIB)


def _last_xid(gpu: GpuReading, snap: Snapshot) -> float:
    names = {kernel_name(gpu.pci_bus_id), str(gpu.index)}
    return float(next((code for source, code in snap.last_xids if source in names), 0))


def _row(cause: str) -> Callable[[GpuReading, Snapshot], float | None]:
    def read(gpu: GpuReading, snap: Snapshot) -> float | None:
        value = gpu.remapped.get(cause)
        return None if value is None else float(value)
    return read


def _ratio(metric: str) -> Callable[[GpuReading, Snapshot], float | None]:
    def read(gpu: GpuReading, snap: Snapshot) -> float | None:
        percent = gpu.gpm.values.get(metric) if gpu.gpm is not None else None
        return None if percent is None else percent / 100.0
    return read


READINGS: Mapping[str, Callable[[GpuReading, Snapshot], float | None]] = {
    "DCGM_FI_DEV_GPU_UTIL": _util,
    "DCGM_FI_DEV_FB_USED": _used,
    "DCGM_FI_DEV_FB_FREE": lambda gpu, snap: _mib(gpu.memory_free),
    "DCGM_FI_DEV_FB_RESERVED": lambda gpu, snap: _mib(gpu.memory_reserved),
    "DCGM_FI_DEV_GPU_TEMP": lambda gpu, snap: gpu.temperature,
    "DCGM_FI_DEV_POWER_USAGE": lambda gpu, snap: gpu.power_watts,
    "DCGM_FI_DEV_XID_ERRORS": _last_xid,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _row("uncorrectable"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _row("correctable"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _row("failure"),
    **{name: _ratio(metric) for name, metric in PROFILING.items()},
}


def kernel_name(bus_id: str) -> str:
    """`0000:3b:00`, the kernel's name for NVML's `00000000:3B:00.0`, as Xids name a GPU."""
    domain, _, rest = bus_id.partition(":")
    bus, _, device = rest.partition(":")
    try:
        return pci_name(domain, bus, device.split(".")[0])
    except ValueError:
        return bus_id


def families(snap: Snapshot, holders: Mapping[str, list[Holder]]) -> Iterator[Metric]:
    """One family per series field of `FIELDS`, one series per GPU (a profiling family
    only where a GPU has its value); `holders`: the containers holding each GPU (by UUID)."""
    for field in FIELDS:
        if field.kind == LABEL:
            continue
        family = Metric(field.name, field.doc, field.kind)
        read = READINGS[field.name]
        for gpu in snap.gpus:
            value = read(gpu, snap)
            if value is None:
                continue
            held = holders.get(gpu.uuid) or []
            holder = held[0] if len(held) == 1 else ("", "", "")
            family.add_sample(field.name, _labels(gpu, snap, holder), float(value))
        if family.samples or field.name not in PROFILING:
            yield family


def _labels(gpu: GpuReading, snap: Snapshot, holder: Holder) -> dict[str, str]:
    """The series' labels. An empty `Hostname` is left out, as dcgm-exporter leaves it out;
    empty pod labels stay: with the PodMonitor's `honorLabels`, an absent `pod` would take
    the agent pod's own name, and the GPU would seem to be the agent's."""
    values = (str(gpu.index), gpu.uuid, gpu.pci_bus_id, f"nvidia{gpu.index}", gpu.model,
              snap.node_name)
    labels = {**dict(zip(LABELS, values, strict=True)), DRIVER_VERSION: snap.driver_version,
              **dict(zip(POD_LABELS, holder, strict=True))}
    return {k: v for k, v in labels.items() if v or k not in OPTIONAL}


def text_headers(body: bytes) -> bytes:
    """The Prometheus text format as dcgm-exporter writes a counter: prometheus-client names
    a counter's HELP and TYPE lines `<name>_total` while the samples keep `<name>`; here the
    lines name the samples' family again (the OpenMetrics format needs no change)."""
    for name in COUNTERS:
        for kind in (b"HELP", b"TYPE"):
            body = body.replace(b"# %s %s_total " % (kind, name.encode()),
                                b"# %s %s " % (kind, name.encode()))
    return body
