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

from installer.agent.metrics import dcgm, gke, gpmfamilies
from installer.agent.metrics.attribution import claimed, gpu_holders, holdings, is_gpu_resource
from installer.agent.metrics.labels import GPU_LABELS, PREFIX
from installer.agent.metrics.labels import gauge as _gauge
from installer.agent.metrics.labels import gpu_labels as _gpu_labels
from installer.agent.metrics.snapshot import GpuReading, Snapshot
from installer.node.podresources import ContainerDevices

ATTRIBUTION = "attribution"  # our label on GKE's per-container series: exact or shared


def families(snap: Snapshot, now: float, *, dcgm_names: bool = False) -> Iterator[Metric]:
    """Every family the snapshot has data for (a family with no series is still listed)."""
    for section in sections(snap, now, dcgm_names=dcgm_names):
        yield from section()


def sections(snap: Snapshot, now: float, *, dcgm_names: bool = False, part: str = "all"
             ) -> list[Callable[[], list[Metric]]]:
    """The families in groups, each built whole or not at all (a bug costs its group);
    `dcgm_names` adds dcgm-exporter's family. `part`: "static" (what only the snapshot
    decides), "live" (what changes with `now`: the collection's section) or "all"."""
    static = [lambda: list(_install(snap)), lambda: list(_agent(snap)),
              lambda: list(_gpus(snap)), lambda: list(_gke_node(snap)),
              lambda: list(_gke_containers(snap)), lambda: list(gpmfamilies.families(snap))]
    if dcgm_names:
        static.append(lambda: list(dcgm.families(snap, gpu_holders(snap))))
    live: list[Callable[[], list[Metric]]] = [lambda: list(_collection(snap, now))]
    return {"static": static, "live": live}.get(part, static + live)


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
    yield from (ready, up, restarts, fabric, xids)


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
