"""SM activity without DCGM: NVML's GPU Performance Monitoring (GPM), Hopper and later.

Duty cycle says a kernel ran; GPM says how much of the GPU it used. NVML computes a GPM
metric from two samples of the GPU's counters (nvml.h: nvmlGpmSampleGet twice, more than
100 ms apart, then nvmlGpmMetricsGet over the interval), so each collection samples every
supported GPU, waits the configured interval once for all of them, samples again and asks
for SM activity, SM occupancy, tensor activity and DRAM bandwidth: what dcgm-exporter
serves as DCGM_FI_PROF_SM_ACTIVE, _SM_OCCUPANCY, _PIPE_TENSOR_ACTIVE and _DRAM_ACTIVE.
The wait runs on the collector's thread: a scrape never waits for it.

Whether a GPU supports GPM is asked once per GPU (nvmlGpmQueryDeviceSupport; a driver
without the call supports it nowhere) and said in the log once; the answer is served.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pynvml  # type: ignore[import-untyped]

from installer.agent.metrics.snapshot import GpmReading

# our name -> NVML's metric id (nvml.h nvmlGpmMetricId_t); values are percentages 0..100
METRICS = {
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}
MIN_INTERVAL_S = 0.1  # nvml.h: samples closer than the internal refresh rate say nothing


class GpmReader:
    """Samples GPUs in pairs; keeps each GPU's two sample buffers (allocated once, for the
    agent's life) and its support answer."""

    def __init__(self, log: Any, interval_s: float,
                 wait: Callable[[float], object] = time.sleep) -> None:
        self.log, self.interval_s, self.wait = log, interval_s, wait
        self.support: dict[str, str] = {}  # UUID -> "" (supported) or why not
        self.buffers: dict[str, tuple[Any, Any]] = {}

    def read(self, gpus: list[tuple[str, Any]]) -> tuple[dict[str, GpmReading], list[str]]:
        """Each GPU's reading by UUID, from (UUID, handle) pairs, and each failure."""
        found: dict[str, GpmReading] = {}
        errors: list[str] = []
        first: list[tuple[str, Any]] = []
        for uuid, handle in gpus:
            reason = self._support(uuid, handle)
            if reason:
                found[uuid] = GpmReading(supported=False, reason=reason)
                continue
            try:
                pynvml.nvmlGpmSampleGet(handle, self._buffers(uuid)[0])
            except pynvml.NVMLError as exc:
                errors.append(f"{uuid}: nvmlGpmSampleGet: {exc}")
                found[uuid] = GpmReading(supported=True)
                continue
            first.append((uuid, handle))
        if first:
            self.wait(self.interval_s)
        for uuid, handle in first:
            try:
                found[uuid] = GpmReading(supported=True, values=self._metrics(uuid, handle))
            except pynvml.NVMLError as exc:
                errors.append(f"{uuid}: GPM: {exc}")
                found[uuid] = GpmReading(supported=True)
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

    def _buffers(self, uuid: str) -> tuple[Any, Any]:
        if uuid not in self.buffers:
            self.buffers[uuid] = (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
        return self.buffers[uuid]

    def _metrics(self, uuid: str, handle: Any) -> dict[str, float]:
        """The second sample, then the metrics over both."""
        first, second = self._buffers(uuid)
        pynvml.nvmlGpmSampleGet(handle, second)
        get = pynvml.c_nvmlGpmMetricsGet_t()
        get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(METRICS)
        get.sample1, get.sample2 = first, second
        for slot, metric in enumerate(METRICS.values()):
            get.metrics[slot].metricId = metric
        pynvml.nvmlGpmMetricsGet(get)
        return {name: float(get.metrics[slot].value)
                for slot, name in enumerate(METRICS)
                if get.metrics[slot].nvmlReturn == pynvml.NVML_SUCCESS}
