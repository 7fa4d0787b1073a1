"""GPM's activity ratios as families: per GPU, per MIG GPU instance, per container.

A container gets a series only where the activity is its own: a whole GPU it holds alone
(`holdings`, attribution exact), or a MIG GPU instance it holds alone (`mig_holdings`). A
shared GPU's activity is its holders' together, so it has no per-container value.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from installer.agent.metrics.attribution import EXACT, holdings, mig_holdings
from installer.agent.metrics.labels import GPU_LABELS, PREFIX, gauge, gpu_labels
from installer.agent.metrics.snapshot import Snapshot

# GPM's metrics (gpm.METRICS) as ratios: name -> DCGM's field (DCGM_FI_PROF_...), meaning
GPM = {
    "sm_active": ("PROF_SM_ACTIVE", "SMs with at least one warp assigned"),
    "sm_occupancy": ("PROF_SM_OCCUPANCY", "warps resident on the SMs, of the most "
                     "they hold"),
    "tensor_active": ("PROF_PIPE_TENSOR_ACTIVE", "cycles any tensor pipe was busy"),
    "dram_active": ("PROF_DRAM_ACTIVE", "DRAM bandwidth used, of its peak"),
    "graphics_active": ("PROF_GR_ENGINE_ACTIVE", "time any graphics or compute engine "
                        "was active"),
}
CONTAINER_LABELS = ["namespace", "pod", "container", "gpu", "uuid"]
INSTANCE = "gpu_instance_id"  # dcgm-exporter's GPU_I_ID, in our label style


def families(snap: Snapshot) -> Iterator[Metric]:
    """`gpu_gpm_supported`, then per GPU, per MIG GPU instance and per container."""
    supported = gauge(PREFIX + "gpu_gpm_supported", "1 if NVML's GPU Performance "
                      "Monitoring reads the GPU (Hopper and later), 0 with the reason if not "
                      "(its SM activity series are absent)", [*GPU_LABELS, "reason"])
    per_gpu = _ratios("gpu_{}_ratio", "Fraction of {doc} over the GPM interval (NVML GPM; "
                      "DCGM field {dcgm}), 0..1", GPU_LABELS)
    per_instance = _ratios("gpu_mig_{}_ratio", "Fraction of {doc} in one MIG GPU instance "
                           "over the GPM interval (NVML GPM; DCGM field {dcgm} with GPU_I_ID),"
                           " 0..1", [*GPU_LABELS, INSTANCE])
    per_container = _ratios("container_gpu_{}_ratio", "The {name} ratio of the GPU, or MIG "
                            "GPU instance, the container holds alone (uuid: the GPU's or the "
                            "MIG device's)", CONTAINER_LABELS)
    for gpu in snap.gpus:
        if gpu.gpm is None:
            continue
        labels = gpu_labels(gpu, gpu.index)
        supported.add_metric([*labels, gpu.gpm.reason], int(gpu.gpm.supported))
        _add(per_gpu, labels, gpu.gpm.values)
        for gi, values in sorted(gpu.gpm.instances.items()):
            _add(per_instance, [*labels, str(gi)], values)
    for (namespace, pod, container), gpus in sorted(holdings(snap).items()):
        for gpu, attribution in gpus.values():
            if attribution == EXACT and gpu.gpm is not None:
                _add(per_container, [namespace, pod, container, str(gpu.index), gpu.uuid],
                     gpu.gpm.values)
    for (namespace, pod, container), instances in mig_holdings(snap).items():
        for gpu, gi, mig_uuid in instances:
            if gpu.gpm is not None:
                _add(per_container, [namespace, pod, container, str(gpu.index), mig_uuid],
                     gpu.gpm.instances.get(gi, {}))
    yield supported
    yield from (*per_gpu.values(), *per_instance.values(), *per_container.values())


def _ratios(name: str, doc: str, labels: list[str]) -> dict[str, GaugeMetricFamily]:
    """One gauge per GPM metric, named and documented from the templates."""
    return {key: gauge(PREFIX + name.format(key), doc.format(
        doc=meaning, dcgm=dcgm, name=key.replace("_", " ")), labels)
            for key, (dcgm, meaning) in GPM.items()}


def _add(found: dict[str, GaugeMetricFamily], labels: list[str],
         percents: dict[str, float]) -> None:
    for key, percent in percents.items():
        if key in found:
            found[key].add_metric(labels, percent / 100.0)
