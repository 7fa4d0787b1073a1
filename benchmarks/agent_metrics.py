"""Benchmark: the agent's /metrics on an 8-GPU node: scrape latency and the agent's RSS,
against the same agent with metrics off and a bare pynvml loop reading the same fields.

    .venv/bin/python benchmarks/agent_metrics.py [--scrapes 500] [--seconds 60] [--json] [--quick]

Two real `gpu-node-installer agent` processes run on two host-tier 8-GPU NVSwitch nodes
(tests/agentnode.py, as benchmarks/agent_idle.py sets them up: the stand-in driver made
ready by the real `signal`, daemon stand-ins, a silent /dev/kmsg FIFO, the strict fake API
for NODE_NAME), one with METRICS_PORT on 127.0.0.1 and METRICS_INTERVAL=5 (GPM on, its
default METRICS_GPM_INTERVAL=1, and dcgm-exporter's names, METRICS_DCGM_NAMES=true), one the
same with METRICS_GPM_INTERVAL=0 (GPM off) and without dcgm-exporter's names, one with
METRICS_PORT=0. The NVML stand-in reports per-GPU readings set here
(FAKE_NVML_METRICS_FILE), SM, tensor and DRAM activity (GPM) included. The baseline is a
bare Python process that loads the same staged libnvidia-ml and reads, every 5 s, the
fields the collector reads (utilisation samples, memory, temperature, power, ECC, remapped
rows, UUID, name, PCI id) for 8 GPUs.
  scrape   wall time of `--scrapes` sequential GETs of /metrics (a new connection each, as a
           Prometheus without keep-alive), p50/p99/max in ms; target <= 50 ms (GPM on:
           p99 <= 10 ms); the agents with GPM on and off are scraped in turn, in one run
  RSS      VmRSS max over `--seconds` (sampled every second) and PSS at the end, MB (10^6 B);
           target: the agent with metrics on <= 60 MB (with GPM and dcgm-exporter's names
           on, as here: <= 45 MB)
  pass     the baseline's own time for one 8-GPU pass, ms (what NVML costs, not the server)
Without `--kubelet` the PodResources socket is absent (a node without the kubelet's API
mounted), as on such a node. With `--kubelet` a real gRPC PodResources server
(tests/podresources.py, grpcio) assigns one GPU to each of 8 containers, so the agent's client
(one unary gRPC call over HTTP/2 through h2, installer/node/grpcunix.py) runs every collection
and the per-container series are served too; "grpcio loaded" checks the agent's memory maps
for grpcio's extension, which the agent must never load. `--quick` (the test suite runs it):
10 scrapes and a 2 s RSS window.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

import kubefake  # noqa: E402
import podresources  # noqa: E402
from agent_idle import pss_mb, rss_mb  # noqa: E402
from agentnode import NODE, AgentNode, daemon_package, make_node  # noqa: E402

from installer.node.podresources import ContainerDevices  # noqa: E402

GPUS = 8
BASELINE = r"""
import ctypes, sys, time
ctypes.CDLL(sys.argv[1])
import pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
last = {}
def one_pass():
    for h in handles:
        uuid = pynvml.nvmlDeviceGetUUID(h)
        pynvml.nvmlDeviceGetName(h); pynvml.nvmlDeviceGetPciInfo(h)
        since = last.get(uuid, int((time.time() - 10) * 1e6))
        _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since)
        last[uuid] = max(s.timeStamp for s in samples)
        pynvml.nvmlDeviceGetMemoryInfo(h); pynvml.nvmlDeviceGetTemperature(h, 0)
        pynvml.nvmlDeviceGetPowerUsage(h); pynvml.nvmlDeviceGetRemappedRows(h)
        for kind in (0, 1):
            pynvml.nvmlDeviceGetTotalEccErrors(h, kind, 0)
times = []
while True:
    start = time.perf_counter(); one_pass(); times.append(time.perf_counter() - start)
    print(f"{1000 * sorted(times)[len(times) // 2]:.3f}", flush=True)
    time.sleep(5)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node_for(work: Path, package: object, env: dict[str, str], sockets: Path) -> AgentNode:
    readings = work / "nvml-metrics"
    work.mkdir(parents=True)
    readings.write_text("".join(f"util={10 * i},{10 * i + 5} mem_used_mib={2048 * i} temp=5{i} "
                                f"power_mw={250000 + i} ecc_corrected={i} sm_active={5 * i} "
                                f"sm_occupancy={4 * i} tensor_active={3 * i} dram_active={i}\n"
                                for i in range(GPUS)))
    node = make_node(work, package, gpus=GPUS,  # type: ignore[arg-type]
                     env={"FAKE_NVML_METRICS_FILE": str(readings), "METRICS_INTERVAL": "5",
                          "POD_RESOURCES_DIR": str(sockets), **env})
    kmsg = node.root / "dev/kmsg"
    os.mkfifo(kmsg)
    return node


def silent_kmsg(node: AgentNode) -> int:
    """Hold the FIFO open for writing: the agent's kmsg reads block (a quiet node)."""
    kmsg = node.root / "dev/kmsg"
    reader = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(kmsg, os.O_WRONLY)
    os.close(reader)
    return writer


def scrape_ms(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        response.read()
    return 1000 * (time.perf_counter() - start)


def wait_served(url: str, want: bytes, deadline_s: float = 120) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if want in response.read():
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def summary(latencies: list[float]) -> dict[str, float]:
    """p50, p99 and max of scrape times in ms."""
    ordered = sorted(latencies)
    return {"p50": round(statistics.median(ordered), 2),
            "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 2),
            "max": round(ordered[-1], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60.0, help="RSS window")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubelet", action="store_true",
                        help="serve PodResources: 8 containers with one GPU each")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    args = parser.parse_args()
    if args.quick:
        args.scrapes, args.seconds = 10, 2.0
    sockets = podresources.short_dir()
    holders = [ContainerDevices("bench", f"pod-{i}", "main", "nvidia.com/gpu", (f"nvidia{i}",))
               for i in range(GPUS)]
    with podresources.serve(sockets, holders if args.kubelet else []) as kubelet:
        if not args.kubelet:
            kubelet.socket.unlink()  # no socket: as a node without the kubelet's API mounted
        try:
            return measure(args, sockets)
        finally:
            import shutil

            shutil.rmtree(sockets, ignore_errors=True)


def measure(args: argparse.Namespace, sockets: Path) -> int:
    """Start the agents and the baseline, scrape, sample RSS, report."""
    port, port_gpm_off = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    url_gpm_off = f"http://127.0.0.1:{port_gpm_off}/metrics"
    processes: dict[str, subprocess.Popen[bytes]] = {}
    writers: list[int] = []
    with tempfile.TemporaryDirectory(prefix="agent-metrics-") as tmp:
        work = Path(tmp)
        package = daemon_package(work / "pkg")
        on = node_for(work / "on", package, {"METRICS_PORT": str(port),
                                             "METRICS_ADDRESS": "127.0.0.1",
                                             "METRICS_DCGM_NAMES": "true"}, sockets)
        gpm_off = node_for(work / "gpm-off", package, {
            "METRICS_PORT": str(port_gpm_off), "METRICS_ADDRESS": "127.0.0.1",
            "METRICS_GPM_INTERVAL": "0"}, sockets)
        off = node_for(work / "off", package, {"METRICS_PORT": "0"}, sockets)
        writers = [silent_kmsg(on), silent_kmsg(gpm_off), silent_kmsg(off)]
        cluster = kubefake.Cluster(nodes={NODE: kubefake.node_doc(NODE)})
        launcher = [sys.executable, "-c", "import sys; sys.modules['rich'] = None; "
                    "from installer.cli import main; sys.argv[0] = 'gpu-node-installer'; main()"]
        try:
            with kubefake.serve(cluster) as api:
                for name, node in (("agent", on), ("agent-gpm-off", gpm_off),
                                   ("agent-metrics-off", off)):
                    log = open(node.root / "agent.log", "w")  # noqa: SIM115 (process's)
                    processes[name] = subprocess.Popen(
                        launcher + node.command("agent", api=api)[3:], env=node.env,
                        cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
                library = on.install / "lib64/libnvidia-ml.so.1"
                processes["pynvml-loop"] = subprocess.Popen(
                    [sys.executable, "-c", BASELINE, str(library)], env=on.env,
                    stdout=subprocess.PIPE)
                want = b"duty_cycle{" if args.kubelet else b"duty_cycle_gpu_node{"
                if not (wait_served(url, want) and wait_served(url_gpm_off, want)
                        and wait_served(url, b"gpu_node_installer_gpu_sm_active_ratio{")
                        and wait_served(url, b"DCGM_FI_PROF_SM_ACTIVE{")):
                    print(on.log()[-3000:], gpm_off.log()[-3000:], file=sys.stderr)
                    return 1
                latencies, latencies_gpm_off = [], []
                for _ in range(args.scrapes):  # in turn: both see the same load
                    latencies.append(scrape_ms(url))
                    latencies_gpm_off.append(scrape_ms(url_gpm_off))
                peak = {name: rss_mb(p.pid) for name, p in processes.items()}
                begin = time.monotonic()
                while time.monotonic() - begin < args.seconds:
                    time.sleep(1)
                    for name, p in processes.items():
                        peak[name] = max(peak[name], rss_mb(p.pid))
                pss = {name: pss_mb(p.pid)[0] for name, p in processes.items()}
                maps = Path(f"/proc/{processes['agent'].pid}/maps").read_text()
                grpcio_loaded = "cygrpc" in maps
        finally:
            for process in processes.values():
                process.terminate()
            for process in processes.values():
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
            for fd in writers:
                os.close(fd)
        baseline_out = processes["pynvml-loop"].stdout
        passes = baseline_out.read().decode().split() if baseline_out else []
    report = {
        "gpus": GPUS, "scrapes": args.scrapes, "kubelet": args.kubelet,
        "load_average": os.getloadavg(),
        "scrape_ms": summary(latencies), "scrape_ms_gpm_off": summary(latencies_gpm_off),
        "rss_max_mb": {k: round(v, 1) for k, v in peak.items()}, "pss_mb": pss,
        "baseline_pass_ms_median": float(passes[-1]) if passes else None,
        "grpcio_loaded": grpcio_loaded}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    s = report["scrape_ms"]
    print(f"{GPUS} GPUs, kubelet PodResources: {args.kubelet}, {args.scrapes} scrapes "
          f"(load average {os.getloadavg()[0]:.2f}): "
          f"p50 {s['p50']} ms, p99 {s['p99']} ms, max {s['max']} ms")  # type: ignore[index]
    off = summary(latencies_gpm_off)
    print(f"GPM off, same run: p50 {off['p50']} ms, p99 {off['p99']} ms, max {off['max']} ms")
    for name in processes:
        print(f"{name:<18} RSS max {peak[name]:6.1f} MB  PSS {pss[name]:6.1f} MB")
    print(f"baseline: one 8-GPU pynvml pass, median {report['baseline_pass_ms_median']} ms; "
          f"grpcio loaded in the agent: {grpcio_loaded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
