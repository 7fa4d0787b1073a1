"""A snapshot as Prometheus metric families: GKE's drop-in names and our own prefix.

Pure: the same snapshot renders the same families, at any time, on any thread. GKE's
device plugin (`--enable-container-gpu-metrics`) names the per-container series
`duty_cycle`, `memory_used`, `memory_total`, `request` and the per-node ones
`*_gpu_node`; their names, labels and help texts come from `gke.FAMILIES` (with its
provenance), so dashboards and HPAs built on them work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from installer.agent.metrics import dcgm, gke
from installer.agent.metrics.attribution import (
    EXACT,
    SHARED,
    Attributed,
    claim_device,
    is_gpu_resource,
    plugin_device,
)
from installer.agent.metrics.snapshot import GpuReading, Snapshot
from installer.node.podresources import ClaimDevice, ContainerDevices

PREFIX = "gpu_node_installer_"
GPU_LABELS = ["gpu", "uuid", "model", "pci_bus_id"]
ATTRIBUTION = "attribution"  # our label on GKE's per-container series: exact or shared
Holder = tuple[str, str, str]  # (namespace, pod, container)


def families(snap: Snapshot, now: float, *, dcgm_names: bool = False) -> Iterator[Metric]:
    """Every family the snapshot has data for (a family with no series is still listed)."""
    for section in sections(snap, now, dcgm_names=dcgm_names):
        yield from section()


def sections(snap: Snapshot, now: float, *, dcgm_names: bool = False
             ) -> list[Callable[[], list[Metric]]]:
    """The families in groups, each built whole or not at all (a bug costs its group);
    `dcgm_names` adds dcgm-exporter's family."""
    found = [lambda: list(_install(snap)), lambda: list(_agent(snap)),
             lambda: list(_gpus(snap)), lambda: list(_gke_node(snap)),
             lambda: list(_gke_containers(snap)), lambda: list(_gpm(snap)),
             lambda: list(_collection(snap, now))]
    if dcgm_names:
        found.append(lambda: list(dcgm.families(snap, gpu_holders(snap))))
    return found


def _gauge(name: str, doc: str, labels: list[str] | None = None,
           unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def _install(snap: Snapshot) -> Iterator[Metric]:
    facts = snap.install
    info = _gauge(PREFIX + "info", "The installed driver (value 1)",
                  ["driver_version", "flavour", "kernel", "cuda_version", "package_digest"])
    if facts.driver_version:
        info.add_metric([facts.driver_version, facts.flavour, facts.kernel,
                         facts.cuda_version, facts.package_digest], 1)
    yield info
    code = _gauge(PREFIX + "last_install_exit_code",
                  "Exit code of the last install run on this node (0: success)")
    fast = _gauge(PREFIX + "install_fast_path",
                  "1 if the last install reused the cached, verified package (reboot fast path)")
    if facts.exit_code is not None:
        code.add_metric([], facts.exit_code)
    if facts.fast_path is not None:
        fast.add_metric([], int(facts.fast_path))
    stages = _gauge(PREFIX + "install_stage_seconds",
                    "Duration of each stage of the last install run", ["stage"])
    for stage, seconds in sorted(facts.stage_seconds.items()):
        stages.add_metric([stage], seconds)
    yield from (code, fast, stages)


def _agent(snap: Snapshot) -> Iterator[Metric]:
    ready = _gauge(PREFIX + "ready", "1 while the agent holds the node ready for GPU pods")
    if snap.ready is not None:
        ready.add_metric([], int(snap.ready))
    up = _gauge(PREFIX + "daemon_up", "1 while the supervised daemon runs", ["daemon"])
    restarts = CounterMetricFamily(PREFIX + "daemon_restarts",
                                   "Restarts of the supervised daemon since the agent started",
                                   labels=["daemon"])
    for name, running, count in snap.daemons:
        up.add_metric([name], int(running))
        restarts.add_metric([name], count)
    fabric = _gauge(PREFIX + "gpu_fabric_state",
                    "1 for the GPU's current NVLink fabric state (NVML)", [*GPU_LABELS, "state"])
    by_index = {g.index: g for g in snap.gpus}
    for index, state in snap.fabric:
        fabric.add_metric([*_gpu_labels(by_index.get(index), index), state], 1)
    xids = CounterMetricFamily(PREFIX + "xid_errors", "Xid errors seen since the agent "
                               "started, by GPU (PCI address or index) and Xid",
                               labels=["gpu", "xid"])
    for gpu, code, count in snap.xids:
        xids.add_metric([gpu, str(code)], count)
    next_kernel = _gauge(PREFIX + "next_kernel_ready", "1 when the driver package of the "
                         "kernel the node boots next is ready in the host cache, 0 while it is "
                         "missing, building or failed (no series: no next kernel)",
                         ["kernel", "state"])
    if snap.next_kernel is not None:
        kernel, state = snap.next_kernel
        next_kernel.add_metric([kernel, state], int(state == "ready"))
    yield from (ready, up, restarts, fabric, xids, next_kernel)


def _gpu_labels(gpu: GpuReading | None, index: int) -> list[str]:
    if gpu is None:
        return [str(index), "", "", ""]
    return [str(gpu.index), gpu.uuid, gpu.model, gpu.pci_bus_id]


def _gpus(snap: Snapshot) -> Iterator[Metric]:
    duty = _gauge(PREFIX + "gpu_duty_cycle_ratio", "Fraction of the last collection interval "
                  "the GPU was busy (NVML utilisation samples), 0..1",
                  [*GPU_LABELS, "source"])
    used = _gauge(PREFIX + "gpu_memory_used_bytes", "GPU memory allocated", GPU_LABELS)
    total = _gauge(PREFIX + "gpu_memory_total_bytes", "GPU memory in total", GPU_LABELS)
    temp = _gauge(PREFIX + "gpu_temperature_celsius", "GPU core temperature", GPU_LABELS)
    power = _gauge(PREFIX + "gpu_power_watts", "GPU power draw", GPU_LABELS)
    ecc = CounterMetricFamily(PREFIX + "gpu_ecc_errors", "Volatile ECC errors since the "
                              "driver loaded", labels=[*GPU_LABELS, "type"])
    rows = _gauge(PREFIX + "gpu_remapped_rows", "Remapped memory rows by cause (Ampere+)",
                  [*GPU_LABELS, "cause"])
    unreadable = _gauge(PREFIX + "gpu_unreadable", "1 for a GPU not served: NVML gave its "
                        "name, UUID or PCI bus id in bytes that are not UTF-8", ["gpu", "reason"])
    for index, cause in snap.unreadable:
        unreadable.add_metric([str(index), cause], 1)
    for gpu in snap.gpus:
        labels = _gpu_labels(gpu, gpu.index)
        if gpu.duty_cycle is not None:
            duty.add_metric([*labels, gpu.utilization_source], gpu.duty_cycle / 100.0)
        for family, value in ((used, gpu.memory_used), (total, gpu.memory_total),
                              (temp, gpu.temperature), (power, gpu.power_watts)):
            _add(family, labels, value)
        for kind, count in sorted(gpu.ecc.items()):
            ecc.add_metric([*labels, kind], count)
        for cause, count in sorted(gpu.remapped.items()):
            rows.add_metric([*labels, cause], count)
    yield from (duty, used, total, temp, power, ecc, rows, unreadable)


# GPM's metrics (gpm.METRICS) as ratios: name -> DCGM's field (DCGM_FI_PROF_...), meaning
GPM = {
    "sm_active": ("PROF_SM_ACTIVE", "SMs with at least one warp assigned"),
    "sm_occupancy": ("PROF_SM_OCCUPANCY", "warps resident on the SMs, of the most "
                     "they hold"),
    "tensor_active": ("PROF_PIPE_TENSOR_ACTIVE", "cycles any tensor pipe was busy"),
    "dram_active": ("PROF_DRAM_ACTIVE", "DRAM bandwidth used, of its peak"),
}
CONTAINER_LABELS = ["namespace", "pod", "container", "gpu", "uuid"]


def _gpm(snap: Snapshot) -> Iterator[Metric]:
    """GPM per GPU, and per container for the GPUs a container holds alone (a shared GPU's
    activity is its holders' together: no per-container value)."""
    supported = _gauge(PREFIX + "gpu_gpm_supported", "1 if NVML's GPU Performance "
                       "Monitoring reads the GPU (Hopper and later), 0 with the reason if not "
                       "(its SM activity series are absent)", [*GPU_LABELS, "reason"])
    per_gpu = {name: _gauge(f"{PREFIX}gpu_{name}_ratio", f"Fraction of {doc} over the GPM "
                            f"interval (NVML GPM; DCGM field {dcgm}), 0..1", GPU_LABELS)
               for name, (dcgm, doc) in GPM.items()}
    per_container = {name: _gauge(f"{PREFIX}container_gpu_{name}_ratio", f"The GPU's "
                                  f"{name.replace('_', ' ')} ratio for the container holding "
                                  "it alone (exact attribution)", CONTAINER_LABELS)
                     for name in GPM}
    for gpu in snap.gpus:
        if gpu.gpm is None:
            continue
        supported.add_metric([*_gpu_labels(gpu, gpu.index), gpu.gpm.reason],
                             int(gpu.gpm.supported))
        for name, percent in gpu.gpm.values.items():
            if name in per_gpu:
                per_gpu[name].add_metric(_gpu_labels(gpu, gpu.index), percent / 100.0)
    for (namespace, pod, container), gpus in sorted(holdings(snap).items()):
        for gpu, attribution in gpus.values():
            if attribution != EXACT or gpu.gpm is None:
                continue
            for name, percent in gpu.gpm.values.items():
                if name in per_container:
                    per_container[name].add_metric(
                        [namespace, pod, container, str(gpu.index), gpu.uuid], percent / 100.0)
    yield supported
    yield from per_gpu.values()
    yield from per_container.values()


def _gke(name: str, *extra: str) -> GaugeMetricFamily:
    """A GKE family as its table gives it (all GKE's families are gauges), plus `extra`."""
    doc, labels = gke.FAMILIES[name]
    return _gauge(name, doc, [*labels, *extra])


def _gke_triple(suffix: str, *extra: str) -> tuple[GaugeMetricFamily, ...]:
    """GKE's duty cycle, memory used and memory total."""
    return tuple(_gke(f"{name}{suffix}", *extra) for name in ("duty_cycle", "memory_used",
                                                              "memory_total"))


def _add_triple(triple: tuple[GaugeMetricFamily, ...], labels: list[str],
                gpu: GpuReading) -> None:
    for family, value in zip(triple, (gpu.duty_cycle, gpu.memory_used, gpu.memory_total),
                             strict=True):
        _add(family, labels, value)


def _gke_node(snap: Snapshot) -> Iterator[Metric]:
    triple = _gke_triple("_gpu_node")
    for gpu in snap.gpus:
        _add_triple(triple, [gke.MAKE, gpu.uuid, gpu.model], gpu)
    yield from triple


def _gke_containers(snap: Snapshot) -> Iterator[Metric]:
    triple, request = _gke_triple("", ATTRIBUTION), _gke("request")
    for (namespace, pod, container, resource), count in requests(snap).items():
        request.add_metric([namespace, pod, container, resource], count)
    for (namespace, pod, container), gpus in holdings(snap).items():
        for gpu, attribution in gpus.values():
            _add_triple(triple, [namespace, pod, container, gke.MAKE, gpu.uuid, gpu.model,
                                 attribution], gpu)
    claims = _gauge(PREFIX + "container_gpu_claim", "1 for each GPU a container holds "
                    "through a DRA claim of NVIDIA's driver", ["namespace", "pod", "container",
                                                                "claim", "pool", "device",
                                                                "accelerator_id", ATTRIBUTION])
    for device, (gpu, attribution) in claimed(snap):
        claims.add_metric([device.namespace, device.pod, device.container, device.claim,
                           device.pool, device.device, gpu.uuid, attribution], 1)
    yield from (*triple, request, claims)


def requests(snap: Snapshot) -> dict[tuple[str, str, str, str], int]:
    """Devices of GPU resources per (namespace, pod, container, resource), each id once."""
    held: dict[tuple[str, str, str, str], dict[str, None]] = {}
    for row in snap.containers or ():
        if isinstance(row, ContainerDevices) and is_gpu_resource(row.resource):
            key = (row.namespace, row.pod, row.container, row.resource)
            held.setdefault(key, {}).update(dict.fromkeys(row.device_ids))
    return {key: len(ids) for key, ids in held.items() if ids}


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


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    """A known value (float() here: a bad one fails in `collect`, which drops only the
    family, instead of in the exposition, which would fail the scrape)."""
    if value is not None:
        family.add_metric(labels, float(value))


def _collection(snap: Snapshot, now: float) -> Iterator[Metric]:
    errors = CounterMetricFamily(PREFIX + "collection_errors", "Failed reads since the agent "
                                 "started, by source (nvml, nvml_gpu, gpm, podresources, install)",
                                 labels=["source"])
    for source, count in snap.errors:
        errors.add_metric([source], count)
    available = _gauge(PREFIX + "pod_resources_available",
                       "1 when the kubelet's PodResources API answered the last collection")
    available.add_metric([], int(snap.containers is not None))
    age = _gauge(PREFIX + "metrics_age_seconds", "Seconds since the served values were "
                 "collected")
    age.add_metric([], max(0.0, now - snap.taken_at))
    yield from (errors, available, age)
