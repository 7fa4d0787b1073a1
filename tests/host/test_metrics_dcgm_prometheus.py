"""dcgm-exporter's names (METRICS_DCGM_NAMES=true) through a real Prometheus: the agent on the
8-GPU host tree of test_metrics_prometheus.py (same kubelet scene: whole GPUs, a GPU
time-sliced to two pods, a DRA claim), NVML's v2 memory info with reserved memory, an Xid.
The queries of NVIDIA's own dashboard for dcgm-exporter return the numbers our families
give, and what Prometheus scraped passes `promtool check metrics` with dcgm-exporter's naming
findings only."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentnode import A100_BUSES, AgentNode, wait_for
from host.test_agent_metrics import (
    MIB,
    gpu_line,
    metrics_node,
    served,
)
from host.test_metrics_prometheus import AGENT_POD, GPUS, by, kubelet, scraped_agent, uuid
from podresources import Kubelet
from prometheus import Prometheus, check_metrics

from installer.packages.manifest import Package

__all__ = ["kubelet"]  # the kubelet scene, a fixture
RESERVED_MIB = 455
TOTAL_MIB = 40960
# NVIDIA/dcgm-exporter grafana/dcgm-exporter-dashboard.json at d5e5f510: the panels' queries
# for the fields the agent serves (all but "GPU SM Clocks"), `$instance` and `$gpu` as "all"
# (transcribed).
DASHBOARD = {
    "temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~".*", gpu=~".*"}',
    "average temperature": 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~".*", gpu=~".*"})',
    "power": 'DCGM_FI_DEV_POWER_USAGE{instance=~".*", gpu=~".*"}',
    "total power": 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~".*", gpu=~".*"})',
    "utilisation": 'DCGM_FI_DEV_GPU_UTIL{instance=~".*", gpu=~".*"}',
    "memory used": 'DCGM_FI_DEV_FB_USED{instance=~".*", gpu=~".*"}',
    "tensor core utilisation": 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~".*", gpu=~".*"}',
}


def tensor(i: int) -> float:
    """GPU i's tensor activity in percent, as the NVML stand-in's GPM gives it."""
    return 5.0 * i + 2.5


@pytest.fixture
def scraped(tmp_path: Path, package: Package, kubelet: Kubelet
            ) -> Iterator[tuple[AgentNode, Prometheus, str]]:
    lines = [f"{gpu_line(i)} mem_reserved_mib={RESERVED_MIB} tensor_active={tensor(i)}"
             for i in range(GPUS)]
    with scraped_agent(tmp_path, package, kubelet, lines,
                       lambda prom: prom.query('DCGM_FI_DEV_XID_ERRORS{gpu="2"} == 13')
                       and len(prom.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) == GPUS,
                       METRICS_DCGM_NAMES="true", NODE_NAME=AGENT_POD["node"]) as scene:
        yield scene


def per_gpu(prom: Prometheus, promql: str) -> dict[str, float]:
    """{gpu index: value}; a GPU held by several containers must give one value."""
    found: dict[str, set[float]] = {}
    for (index,), value in by(prom, promql, "gpu").items():
        found.setdefault(index, set()).add(value)
    assert all(len(values) == 1 for values in found.values()), found
    return {index: values.pop() for index, values in found.items()}


def test_dcgm_dashboard_queries_give_our_numbers(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, prom, _ = scraped
    gpus = [str(i) for i in range(GPUS)]
    ours = {name: per_gpu(prom, promql) for name, promql in {
        "temperature": "gpu_node_installer_gpu_temperature_celsius",
        "power": "gpu_node_installer_gpu_power_watts",
        "utilisation": "100 * gpu_node_installer_gpu_duty_cycle_ratio",
        "memory used": "gpu_node_installer_gpu_memory_used_bytes / 1048576"}.items()}
    for name in ("temperature", "power", "utilisation"):
        assert per_gpu(prom, DASHBOARD[name]) == pytest.approx(ours[name]), name
        assert sorted(ours[name]) == gpus
    # our used bytes hold the reserved memory (NVML's v1 `used`, as GKE's); DCGM's do not
    assert per_gpu(prom, DASHBOARD["memory used"]) == {
        g: ours["memory used"][g] - RESERVED_MIB for g in gpus}
    assert by(prom, DASHBOARD["average temperature"]) == {
        (): pytest.approx(sum(ours["temperature"].values()) / GPUS)}
    assert by(prom, DASHBOARD["total power"]) == {(): pytest.approx(sum(ours["power"].values()))}
    # the tensor panel: GPM's tensor activity, our ratio under DCGM's profiling name
    tensor_active = per_gpu(prom, DASHBOARD["tensor core utilisation"])
    assert tensor_active == pytest.approx(per_gpu(prom, "gpu_node_installer_gpu_tensor_active_"
                                                  "ratio"))
    assert tensor_active == pytest.approx({str(i): tensor(i) / 100 for i in range(GPUS)})


def test_dcgm_memory_labels_and_pod_mapping(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, prom, _ = scraped
    memory = {kind: per_gpu(prom, f"DCGM_FI_DEV_FB_{kind}") for kind in ("USED", "FREE",
                                                                          "RESERVED")}
    for g in map(str, range(GPUS)):
        assert memory["USED"][g] + memory["FREE"][g] + memory["RESERVED"][g] == TOTAL_MIB
        assert memory["RESERVED"][g] == RESERVED_MIB
    rows = prom.query('DCGM_FI_DEV_GPU_UTIL{gpu="3"}')
    ((labels),) = [row["metric"] for row in rows]
    assert {k: labels[k] for k in ("gpu", "UUID", "pci_bus_id", "device", "modelName",
                                    "Hostname", "namespace", "pod", "container")} == {
        "gpu": "3", "UUID": uuid(3), "pci_bus_id": f"00000000:{A100_BUSES[3]}:00.0",
        "device": "nvidia3", "modelName": "NVIDIA A100-SXM4-40GB",
        "Hostname": AGENT_POD["node"], "namespace": "serve", "pod": "infer-7f9c",
        "container": "server"}
    assert labels["DCGM_FI_DRIVER_VERSION"]
    # one series per GPU: time-sliced GPU 6 (two pods) names none of them
    assert by(prom, 'DCGM_FI_DEV_GPU_UTIL{gpu="6"}', "pod") == {("",): pytest.approx(70)}
    assert by(prom, 'DCGM_FI_DEV_GPU_UTIL{gpu="7"}', "pod") == {("dra-0",): pytest.approx(80)}
    assert by(prom, "DCGM_FI_DEV_XID_ERRORS", "gpu") == {
        (g,): 13.0 if g == "2" else 0.0 for g in map(str, range(GPUS))}
    assert by(prom, 'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu="5"}') == {(): 5}
    meta = prom.api("metadata", {"metric": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"})
    assert [m["type"] for m in meta["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"]] == ["counter"]


def test_promtool_accepts_the_dcgm_family(scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, _, base = scraped
    with urllib.request.urlopen(base + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    assert "# TYPE DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS counter\n" in text
    checked = check_metrics(text)
    assert checked.returncode in (0, 3), checked.stdout + checked.stderr
    findings = {line.split(" ", 1)[1] for line in checked.stderr.strip().splitlines()
                if line.startswith("DCGM_")}
    assert findings == {'counter metrics should have "_total" suffix',
                        "label names should be written in 'snake_case' not 'camelCase'"}


def test_without_nvml_v2_memory_info(tmp_path: Path, package: Package) -> None:
    """A GPU whose NVML has no v2 memory info: no FB_RESERVED, FB_USED with the reserved part
    in it (NVML's v1 `used`); the other GPUs keep theirs. Read straight from the agent."""
    lines = [f"{gpu_line(i)} mem_reserved_mib={RESERVED_MIB}" for i in range(GPUS)]
    lines[1] += " memory_v2=unsupported"
    node, base = metrics_node(tmp_path, package, lines, METRICS_DCGM_NAMES="true")
    with node.agent():
        wait_for(node.ready, timeout=60)
        next(served(base, "DCGM_FI_DEV_FB_USED", gpu="1"))
        with urllib.request.urlopen(base + "/metrics", timeout=30) as reply:
            text = reply.read().decode()

    def mib(name: str, gpu: str) -> list[float]:
        return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(name + "{") and f'gpu="{gpu}"' in line]
    assert mib("DCGM_FI_DEV_FB_RESERVED", "1") == []
    assert mib("DCGM_FI_DEV_FB_USED", "1") == [1001 + RESERVED_MIB]
    assert mib("DCGM_FI_DEV_FB_RESERVED", "0") == [RESERVED_MIB]
    assert mib("DCGM_FI_DEV_FB_USED", "0") == [1000]
    # our own and GKE's used bytes are NVML's v1 `used` on both
    assert [v / MIB for v in mib("gpu_node_installer_gpu_memory_used_bytes", "1")] == [
        1001 + RESERVED_MIB]
    assert [v / MIB for v in mib("gpu_node_installer_gpu_memory_used_bytes", "0")] == [
        1000 + RESERVED_MIB]
