"""SM activity without DCGM: NVML's GPU Performance Monitoring (GPM), Hopper and later.

Duty cycle says a kernel ran; GPM says how much of the GPU it used. NVML computes a GPM
metric from two samples of the GPU's counters (nvml.h: nvmlGpmSampleGet twice, more than
100 ms apart, then nvmlGpmMetricsGet over the interval), so each collection samples every
supported GPU, waits the configured interval once for all of them, samples again and asks
for SM activity, SM occupancy, tensor activity, DRAM bandwidth and graphics engine activity:
what dcgm-exporter serves as DCGM_FI_PROF_SM_ACTIVE, _SM_OCCUPANCY, _PIPE_TENSOR_ACTIVE,
_DRAM_ACTIVE and _GR_ENGINE_ACTIVE.
The wait runs on the collector's thread: a scrape never waits for it. A value NVML gives as
NaN (a real H100 did for DRAM bandwidth over two samples microseconds apart, as when the
agent's stop cuts the wait short) is no reading: left out, as a metric NVML refused.

With MIG on, each GPU instance is sampled too (nvmlGpmMigSampleGet by its GI id, in the
same pass and wait): a container holding a MIG device alone gets its instance's activity.
Whether a GPU supports GPM is asked once per GPU (nvmlGpmQueryDeviceSupport; a driver
without the call supports it nowhere) and said in the log once; the answer is served.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pynvml  # type: ignore[import-untyped]

from installer.agent.metrics.snapshot import GpmReading

# our name -> NVML's metric id (nvml.h nvmlGpmMetricId_t); values are percentages 0..100
METRICS = {
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "graphics_active": pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
}
MIN_INTERVAL_S = 0.1  # nvml.h: samples closer than the internal refresh rate say nothing


Target = tuple[str, int | None]  # (GPU UUID, GPU instance id; None: the whole GPU)


class GpmReader:
    """Samples GPUs, and their MIG GPU instances, in pairs; keeps each target's two sample
    buffers (allocated once, for the agent's life) and each GPU's support answer."""

    def __init__(self, log: Any, interval_s: float,
                 wait: Callable[[float], object] = time.sleep) -> None:
        self.log, self.interval_s, self.wait = log, interval_s, wait
        self.support: dict[str, str] = {}  # UUID -> "" (supported) or why not
        self.buffers: dict[Target, tuple[Any, Any]] = {}

    def read(self, gpus: list[tuple[str, Any]],
             instances: Mapping[str, Iterable[int]] | None = None
             ) -> tuple[dict[str, GpmReading], list[str]]:
        """Each GPU's reading by UUID, from (UUID, handle) pairs and each GPU's MIG GPU
        instance ids (nvmlGpmMigSampleGet per instance), and each failure."""
        found: dict[str, GpmReading] = {}
        errors: list[str] = []
        first: list[tuple[Target, Any]] = []
        for uuid, handle in gpus:
            reason = self._support(uuid, handle)
            if reason:
                found[uuid] = GpmReading(supported=False, reason=reason)
                continue
            for target in [(uuid, None), *((uuid, gi) for gi in (instances or {}).get(uuid, ()))]:
                try:
                    _sample(handle, target[1], self._buffers(target)[0])
                    first.append((target, handle))
                except pynvml.NVMLError as exc:
                    errors.append(f"{_named(target)}: {_call(target)}: {exc}")
        if first:
            self.wait(self.interval_s)
        values: dict[Target, dict[str, float]] = {}
        for target, handle in first:
            try:
                values[target] = self._metrics(target, handle)
            except pynvml.NVMLError as exc:
                errors.append(f"{_named(target)}: GPM: {exc}")
        for uuid, _ in gpus:
            found.setdefault(uuid, GpmReading(
                supported=True, values=values.get((uuid, None), {}),
                instances={gi: v for (u, gi), v in values.items() if u == uuid and gi is not None}))
        return found, errors

    def _support(self, uuid: str, handle: Any) -> str:
        """"" when the GPU supports GPM, else why not (logged the first time)."""
        if uuid in self.support:
            return self.support[uuid]
        try:
            supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            reason = "" if supported else "the GPU has no GPM (Hopper and later have it)"
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                reason = "the driver has no GPM (nvmlGpmQueryDeviceSupport)"
            elif exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                reason = "the GPU has no GPM (Hopper and later have it)"
            else:
                return f"nvmlGpmQueryDeviceSupport: {exc}"  # asked again next pass
        if reason:
            self.log.info("GPM not supported: no SM activity, occupancy, tensor or DRAM "
                          "activity for this GPU", uuid=uuid, reason=reason)
        self.support[uuid] = reason
        return reason

    def _buffers(self, target: Target) -> tuple[Any, Any]:
        if target not in self.buffers:
            self.buffers[target] = (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
        return self.buffers[target]

    def _metrics(self, target: Target, handle: Any) -> dict[str, float]:
        """The second sample, then the metrics over both."""
        first, second = self._buffers(target)
        _sample(handle, target[1], second)
        get = pynvml.c_nvmlGpmMetricsGet_t()
        get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(METRICS)
        get.sample1, get.sample2 = first, second
        for slot, metric in enumerate(METRICS.values()):
            get.metrics[slot].metricId = metric
        pynvml.nvmlGpmMetricsGet(get)
        return {name: float(get.metrics[slot].value)
                for slot, name in enumerate(METRICS)
                if get.metrics[slot].nvmlReturn == pynvml.NVML_SUCCESS
                and math.isfinite(get.metrics[slot].value)}


def _sample(handle: Any, instance: int | None, buffer: Any) -> None:
    """A sample of the whole GPU, or of one of its MIG GPU instances."""
    if instance is None:
        pynvml.nvmlGpmSampleGet(handle, buffer)
    else:
        pynvml.nvmlGpmMigSampleGet(handle, instance, buffer)


def _named(target: Target) -> str:
    uuid, instance = target
    return uuid if instance is None else f"{uuid} GPU instance {instance}"


def _call(target: Target) -> str:
    return "nvmlGpmSampleGet" if target[1] is None else "nvmlGpmMigSampleGet"
