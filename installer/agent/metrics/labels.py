"""What every family of our own prefix shares: the prefix, the GPU labels, a gauge."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from installer.agent.metrics.snapshot import GpuReading

PREFIX = "gpu_node_installer_"
GPU_LABELS = ["gpu", "uuid", "model", "pci_bus_id"]


def gauge(name: str, doc: str, labels: list[str] | None = None,
          unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def gpu_labels(gpu: GpuReading | None, index: int) -> list[str]:
    """GPU_LABELS' values (a GPU NVML could not read has only its index)."""
    if gpu is None:
        return [str(index), "", "", ""]
    return [str(gpu.index), gpu.uuid, gpu.model, gpu.pci_bus_id]
