"""The agent's metrics through a real Prometheus, end to end.

The real `agent` command on an 8-GPU host tree (NVML stand-in readings the test writes), the
kubelet stand-in (tests/podresources.py: real gRPC, PodResources v1) assigning GPUs to
containers the way GKE's device plugin names them (`nvidia<minor>`) and NVIDIA's does
(`GPU-<uuid>`), and Debian's Prometheus scraping the agent every second with the labels the
PodMonitor in daemonset/examples/metrics/ gives a scrape in a cluster. PromQL through
Prometheus' HTTP API returns what the test set; every expression of the Grafana dashboard
and of the prometheus-adapter rule behind the HPA returns series; `promtool check metrics`
accepts the exposition. Waits are polls with generous limits; nothing is timed.
"""

from __future__ import annotations

import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from agentnode import A100_BUSES, AgentNode, make_node, wait_for
from healthkit import record
from host.test_agent_metrics import MIB, free_port, gpu_line, readings, record_install
from metricexamples import adapter_query, adapter_rules, dashboard_queries, variable_metrics
from podresources import Claim, Container, Device, DraDevice, Kubelet, Pod, serve, short_dir
from prometheus import Prometheus, check_metrics, running

from installer.packages.manifest import Package

GPUS = 8
GPU = "nvidia.com/gpu"
# What the PodMonitor's scrape adds in a cluster: the agent pod's own labels and its node.
AGENT_POD = {"namespace": "gpu-node-installer", "pod": "gpu-node-installer-x7k2p",
             "container": "agent", "node": "gpu-node-1"}
# The pods as the kubelet answers for them (tests/podresources.py): one entry per device and
# NUMA node, every container listed. train-0's trainer holds two GPUs by GKE's names (one on
# two NUMA nodes), its evaluator two by NVIDIA's (UUIDs), its logger none; infer-7f9c's
# server one GPU and a NIC. Five GPUs assigned.
TRAIN = Pod("ml", "train-0", (
    Container("trainer", {GPU: (Device("nvidia0", (0,)), Device("nvidia1", (0, 1)))},
              cpu_ids=(8, 9)),
    Container("evaluator", {GPU: (Device("GPU-aaaaaaaa-0000-4000-8000-000000000004", (1,)),
                                  Device("GPU-aaaaaaaa-0000-4000-8000-000000000005", (1,)))}),
    Container("logger")))
INFER = Pod("serve", "infer-7f9c", (Container("server", {
    GPU: (Device("GPU-aaaaaaaa-0000-4000-8000-000000000003", None),),
    "example.com/nic": (Device("nic0"),)}),))
ASSIGNED = 5
# GPU 6 time-sliced by NVIDIA's plugin (renameByDefault: `nvidia.com/gpu.shared`, replica ids
# `GPU-<uuid>::<n>`) to two pods; GPU 7 allocated through a DRA claim of NVIDIA's driver.
SHARED = "nvidia.com/gpu.shared"
SLICES = [Pod("ml", f"slice-{n}", (Container("main", {SHARED: (
    Device(f"GPU-aaaaaaaa-0000-4000-8000-000000000006::{n}"),)}),)) for n in (0, 1)]
DRA = Pod("ml", "dra-0", (Container("worker", claims=(Claim("gpu-claim", "ml", (
    DraDevice("gpu.nvidia.com", "gpu-node-1", "gpu-7", ("k8s.gpu.nvidia.com/claim=c1",)),)),)),))
# GPU 2 in MIG mode with one 1g.5gb GPU instance (GI 7, slot 0) and its one compute instance:
# the NVML stand-in's state file (tests/native/nvml_standin_mig.c: "mode <current>
# <pending>", "gi <id> <profile> <start>", "ci <gi> <ci> <profile> <start>"), the MIG device
# named as the stand-in names it (nvml_standin_mig_devices.c) and held by a pod through
# NVIDIA's plugin (mixed strategy: `nvidia.com/mig-1g.5gb`).
MIG_STATE = "mode 1 1\ngi 7 0 0\nci 7 0 0 0\n"
MIG_UUID = "MIG-5fa0c2d4-0007-4000-8000-000000000002"
MIG = Pod("ml", "mig-0", (Container("main", {"nvidia.com/mig-1g.5gb": (Device(MIG_UUID),)}),))
MIG_SM_ACTIVE = 35  # percent, GPM of GI 7
EXACT = '{attribution="exact", pod!="dra-0"}'  # the device plugins' whole GPUs
GKE_MEMORY_TOTAL = 'memory_total non-counter metrics should not have "_total" suffix'
XID13 = "NVRM: Xid (PCI:0000:{bus}:00): 13, pid=4242, name=python3, Graphics Exception"


def uuid(i: int) -> str:
    return f"GPU-aaaaaaaa-0000-4000-8000-00000000000{i}"


def duty(i: int) -> float:
    """gpu_line's utilisation samples 10i and 10i+20 give a duty cycle of 10i+10 percent."""
    return 10.0 * i + 10


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    directory = short_dir()
    try:
        with serve(directory, [TRAIN, INFER, *SLICES, DRA, MIG]) as stand_in:
            yield stand_in
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def scraped_agent(tmp_path: Path, package: Package, kubelet: Kubelet, lines: list[str],
                  settled: Callable[[Prometheus], object], **env: str
                  ) -> Iterator[tuple[AgentNode, Prometheus, str]]:
    """The agent on the 8-GPU node (GPU readings `lines`, an Xid 13 on GPU 2 in the kernel
    log, `env` added) serving metrics, ready, and a real Prometheus scraping it until
    `settled(prom)` holds."""
    port = free_port()
    (tmp_path / "mig").mkdir()
    (tmp_path / "mig/gpu2").write_text(MIG_STATE)
    node = make_node(tmp_path, package, gpus=GPUS, env={
        "FAKE_NVML_MIG_DIR": str(tmp_path / "mig"),
        "METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1", "METRICS_INTERVAL": "1",
        "FAKE_NVML_METRICS_FILE": str(readings(tmp_path, lines)),
        "POD_RESOURCES_DIR": str(kubelet.socket.parent), **env})
    record_install(node, package)
    (node.root / "dev").mkdir(exist_ok=True)
    (node.root / "dev/kmsg").write_bytes(record(1, XID13.format(bus=A100_BUSES[2])))
    target = f"127.0.0.1:{port}"
    with node.agent(), running([target], tmp_path / "prometheus",
                               target_labels=AGENT_POD) as prom:
        wait_for(node.ready, timeout=60)
        # the first collections may predate the fabric or the kubelet's first answer
        wait_for(lambda: len(prom.query("duty_cycle")) == ASSIGNED + 4 and settled(prom),
                 timeout=90, step=0.5)
        yield node, prom, f"http://{target}"


@pytest.fixture
def scraped(tmp_path: Path, package: Package, kubelet: Kubelet
            ) -> Iterator[tuple[AgentNode, Prometheus, str]]:
    """The agent serving metrics, ready, with a real Prometheus scraping it."""
    lines = [gpu_line(i) for i in range(GPUS)]
    lines[2] += f" gi7.sm_active={MIG_SM_ACTIVE}"  # GPU 2's MIG instance's activity (GPM)

    def settled(prom: Prometheus) -> object:
        return (prom.query('gpu_node_installer_daemon_up{daemon="nv-fabricmanager"} == 1')
                and prom.query("gpu_node_installer_ready == 1")
                and prom.query('gpu_node_installer_container_gpu_sm_active_ratio{pod="mig-0"}'))
    with scraped_agent(tmp_path, package, kubelet, lines, settled) as scene:
        yield scene


def by(prom: Prometheus, promql: str, *labels: str) -> dict[tuple[str, ...], float]:
    """An instant query as {(label values...): value}."""
    return {tuple(row["metric"].get(k, "") for k in labels): float(row["value"][1])
            for row in prom.query(promql)}


def test_per_container_gpu_metrics_through_prometheus(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, prom, _ = scraped
    series = by(prom, "duty_cycle" + EXACT, "namespace", "pod", "container", "accelerator_id",
                "make", "model")
    model = "NVIDIA A100-SXM4-40GB"
    assert series == {
        ("ml", "train-0", "trainer", uuid(0), "nvidia", model): duty(0),
        ("ml", "train-0", "trainer", uuid(1), "nvidia", model): duty(1),
        ("ml", "train-0", "evaluator", uuid(4), "nvidia", model): duty(4),
        ("ml", "train-0", "evaluator", uuid(5), "nvidia", model): duty(5),
        ("serve", "infer-7f9c", "server", uuid(3), "nvidia", model): duty(3)}
    assert by(prom, "memory_used" + EXACT, "pod", "accelerator_id") == {
        ("train-0", uuid(0)): 1000 * MIB, ("train-0", uuid(1)): 1001 * MIB,
        ("train-0", uuid(4)): 1004 * MIB, ("train-0", uuid(5)): 1005 * MIB,
        ("infer-7f9c", uuid(3)): 1003 * MIB}
    assert set(by(prom, "memory_total", "accelerator_id").values()) == {40960 * MIB}
    # GPUs requested: one series per container and resource, each GPU counted once (the
    # kubelet lists each device in an entry of its own); the NIC is not a GPU
    assert by(prom, f'request{{resource_name="{GPU}"}}', "pod", "container") == {
        ("train-0", "trainer"): 2, ("train-0", "evaluator"): 2, ("infer-7f9c", "server"): 1}
    assert by(prom, f'sum(request{{resource_name="{GPU}"}})') == {(): ASSIGNED}
    assert by(prom, 'count(request{pod="train-0", container="trainer"})') == {(): 1}
    # the per-container view agrees with the per-GPU one (same collection)
    ratio = by(prom, "gpu_node_installer_gpu_duty_cycle_ratio", "uuid")
    assert {k[3]: v for k, v in series.items()} == {
        u: pytest.approx(100 * ratio[(u,)]) for u in map(uuid, (0, 1, 3, 4, 5))}
    # GKE's node series: one per GPU, by UUID, with GKE's labels since 2022
    node = prom.query("duty_cycle_gpu_node")
    assert sorted(row["metric"]["accelerator_id"] for row in node) == list(map(uuid, range(GPUS)))
    assert not [row for row in node if {"node_name", "accelerator_index"} & set(row["metric"])]
    # node-level series keep the agent pod's labels, as the PodMonitor's scrape gives them
    ((labels, ready),) = prom.values("gpu_node_installer_ready").items()
    assert ready == 1 and set(AGENT_POD.items()) <= labels


def test_shared_and_dra_gpus_through_prometheus(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    """A time-sliced GPU gives each pod holding a replica its series, marked shared; a GPU
    allocated through DRA gives its container series, and the claim and device by name; a
    MIG device gives its pod its GPU's series, shared, and its instance's SM activity."""
    _, prom, _ = scraped
    assert by(prom, 'duty_cycle{pod=~"slice-.*"}', "pod", "accelerator_id", "attribution") == {
        ("slice-0", uuid(6), "shared"): duty(6), ("slice-1", uuid(6), "shared"): duty(6)}
    assert by(prom, f'request{{resource_name="{SHARED}"}}', "pod") == {
        ("slice-0",): 1, ("slice-1",): 1}
    assert by(prom, 'duty_cycle{pod="dra-0"}', "container", "accelerator_id",
              "attribution") == {("worker", uuid(7), "exact"): duty(7)}
    assert by(prom, "gpu_node_installer_container_gpu_claim", "pod", "container", "claim",
              "pool", "device", "accelerator_id") == {
        ("dra-0", "worker", "ml/gpu-claim", "gpu-node-1", "gpu-7", uuid(7)): 1}
    assert prom.query('request{pod="dra-0"}') == []  # a claim is not a device plugin request
    # a MIG device: its GPU's readings, shared (the GPU's other instances use it too), and
    # its own GPU instance's SM activity, which it holds alone
    assert by(prom, 'duty_cycle{pod="mig-0"}', "container", "accelerator_id",
              "attribution") == {("main", uuid(2), "shared"): duty(2)}
    assert by(prom, 'request{pod="mig-0"}', "resource_name") == {("nvidia.com/mig-1g.5gb",): 1}
    assert by(prom, 'gpu_node_installer_container_gpu_sm_active_ratio{pod="mig-0"}', "uuid",
              "gpu") == {(MIG_UUID, "2"): pytest.approx(MIG_SM_ACTIVE / 100)}
    assert by(prom, "gpu_node_installer_gpu_mig_sm_active_ratio", "gpu",
              "gpu_instance_id") == {("2", "7"): pytest.approx(MIG_SM_ACTIVE / 100)}


def test_node_gpu_and_install_metrics_through_prometheus(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, prom, _ = scraped
    temps = by(prom, "gpu_node_installer_gpu_temperature_celsius", "gpu", "pci_bus_id")
    assert temps == {(str(i), f"00000000:{A100_BUSES[i]}:00.0"): 50.0 + i
                     for i in range(GPUS)}
    assert by(prom, "gpu_node_installer_gpu_power_watts", "gpu")[("5",)] == pytest.approx(205)
    assert by(prom, 'gpu_node_installer_gpu_ecc_errors_total{type="corrected"}', "gpu")[
        ("6",)] == 6
    assert by(prom, "gpu_node_installer_xid_errors_total", "xid") == {("13",): 1}
    assert by(prom, "gpu_node_installer_pod_resources_available") == {(): 1}
    assert by(prom, "gpu_node_installer_last_install_exit_code") == {(): 0}
    assert by(prom, 'gpu_node_installer_install_stage_seconds{stage="load"}') == {
        (): pytest.approx(0.25)}


def test_every_dashboard_and_adapter_expression_returns_series(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, prom, _ = scraped
    # increase() over the restarts counter needs two samples in its window
    wait_for(lambda: prom.query("count_over_time(gpu_node_installer_ready[1m]) >= 3"), 60)
    empty = [title for title, expr in dashboard_queries() if not prom.query(expr)]
    assert empty == [], empty
    for metric in variable_metrics():  # the $node variable's choices
        assert {row["metric"]["node"] for row in prom.query(metric)} == {AGENT_POD["node"]}
    (rule,) = adapter_rules()
    assert prom.query(rule["seriesQuery"])
    # what the HPA sees per pod: the pod's GPUs' mean duty cycle
    assert by(prom, adapter_query(rule, "ml", ["train-0"]), "pod") == {
        ("train-0",): pytest.approx((duty(0) + duty(1) + duty(4) + duty(5)) / 4)}
    assert by(prom, adapter_query(rule, "serve", ["infer-7f9c", "gone-pod"]), "pod") == {
        ("infer-7f9c",): duty(3)}


def test_promtool_accepts_what_prometheus_scraped(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, _, base = scraped
    with urllib.request.urlopen(base + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    assert any(line.startswith("duty_cycle{") and 'pod="train-0"' in line
               for line in text.splitlines())
    checked = check_metrics(text)
    # Exit 3 is lint findings only (1 would be text Prometheus cannot parse). The one finding
    # allowed is GKE's own drop-in name: `memory_total` is a gauge, which promtool's naming
    # lint would have end otherwise; renaming it would break GKE dashboards and HPAs.
    findings = checked.stderr.strip().splitlines()
    assert checked.returncode in (0, 3), checked.stdout + checked.stderr
    assert findings in ([], [GKE_MEMORY_TOTAL]), findings


def test_series_follow_the_kubelet(scraped: tuple[AgentNode, Prometheus, str],
                                   kubelet: Kubelet) -> None:
    """A pod that ends leaves no series behind; a kubelet that fails drops the
    per-container view (counted) and keeps the node's GPUs."""
    _, prom, _ = scraped
    kubelet.pods = [INFER]
    wait_for(lambda: not prom.query('duty_cycle{pod="train-0"}'), timeout=60, step=0.5)
    assert by(prom, "duty_cycle", "pod") == {("infer-7f9c",): duty(3)}
    kubelet.fail = grpc.StatusCode.UNAVAILABLE
    after = time.time()
    wait_for(lambda: by(prom, "gpu_node_installer_pod_resources_available") == {(): 0},
             timeout=60, step=0.5)
    prom.wait_scraped(after=after)
    assert prom.query("duty_cycle") == [] and prom.query("request") == []
    assert prom.query('gpu_node_installer_collection_errors_total{source="podresources"} >= 1')
    assert len(prom.query("gpu_node_installer_gpu_temperature_celsius")) == GPUS
    kubelet.fail = None
    wait_for(lambda: by(prom, "duty_cycle", "pod") == {("infer-7f9c",): duty(3)}, 60, 0.5)
