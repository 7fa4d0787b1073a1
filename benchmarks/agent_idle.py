"""Benchmark: the node agent idling, against a bare Python interpreter and `sleep`.

    .venv/bin/python benchmarks/agent_idle.py [--seconds 600] [--sample 5] [--json] [--quick]

The agent is the real `gpu-node-installer agent` in a subprocess on the host tier's 8-GPU
NVSwitch node (tests/agentnode.py: the stand-in driver staged and made ready by the real
`signal`, the daemon stand-ins as the package's daemons, NVML's fabric state through the
real pynvml over the NVML stand-in). Its Xid source is the kernel log: `<dev>/kmsg` is a
FIFO held open and silent, so the agent's wait blocks in select() as it does on a quiet
node's /dev/kmsg (the NVML stand-in's event wait sleeps in 20 ms steps, unlike the real
driver's, so it would measure the stand-in). Once the agent reports ready, all three
processes are sampled for `--seconds`:
  RSS      VmRSS from /proc/<pid>/status every `--sample` s: max and last (MB = 10^6 B);
           at the end also PSS and private dirty memory (/proc/<pid>/smaps_rollup: shared
           library pages split among their users, and what is this process's alone)
  CPU      (utime + stime) over the window / its length, from /proc/<pid>/stat
  wakeups  voluntary context switches over the window, per minute (no busy polling: an
           idle agent wakes about once per AGENT_INTERVAL, plus its heartbeat)
The daemons (the stand-ins, Python scripts) are not the agent and are not counted.
The agent runs as in the DaemonSet: with NODE_NAME and the API (the strict fake API of
tests/kubefake.py, in this process), so the Kubernetes client is loaded as it is there; and without
`rich`, which the image does not have (it is no dependency of the installer; this project's
dev virtualenv has it through import-linter, and structlog imports it when present:
`--with-rich` measures that too).
Target: agent RSS <= 40 MB as shipped (metrics on), CPU about 0; the report
says whether it is met, and `--check` exits 1 when it is not. `--quick` (the test suite runs
it): a 2 s window sampled every second.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import kubefake  # noqa: E402
from agentnode import NODE, REPO, daemon_package, make_node  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
TARGET_RSS_MB = 40.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def pss_mb(pid: int) -> tuple[float, float]:
    """(PSS, private dirty) in MB: what the process costs the node, shared pages split."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Pss", "Private_Dirty"):
            values[key] = int(rest.split()[0]) * 1024 / 1e6
    return round(values.get("Pss", 0.0), 1), round(values.get("Private_Dirty", 0.0), 1)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def wakeups(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def measure(pids: dict[str, int], seconds: float, sample: float) -> dict[str, dict[str, float]]:
    """Sample every process for `seconds`; RSS max/last, CPU share, wakeups per minute."""
    start = {name: (cpu_s(pid), wakeups(pid)) for name, pid in pids.items()}
    peak = {name: rss_mb(pid) for name, pid in pids.items()}
    begin = time.monotonic()
    while time.monotonic() - begin < seconds:
        time.sleep(min(sample, max(0.0, seconds - (time.monotonic() - begin))))
        for name, pid in pids.items():
            peak[name] = max(peak[name], rss_mb(pid))
    window = time.monotonic() - begin
    return {name: {"rss_max_mb": round(peak[name], 1), "rss_last_mb": round(rss_mb(pid), 1),
                   "pss_mb": pss_mb(pid)[0], "private_mb": pss_mb(pid)[1],
                   "cpu_percent": round(100 * (cpu_s(pid) - start[name][0]) / window, 3),
                   "cpu_s": round(cpu_s(pid) - start[name][0], 2),
                   "wakeups_per_min": round(60 * (wakeups(pid) - start[name][1]) / window, 1)}
            for name, pid in pids.items()}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(node: object, agent: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 120
    while node.view().get("ready") is not True:  # type: ignore[attr-defined]
        if time.monotonic() > deadline or agent.poll() is not None:
            return False
        time.sleep(0.2)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="idle window to measure")
    parser.add_argument("--sample", type=float, default=5.0, help="RSS sampling period")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--with-rich", action="store_true",
                        help="let structlog import rich, as in the dev virtualenv")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 when the agent's RSS max is above {TARGET_RSS_MB:g} MB")
    parser.add_argument("--metrics-off", action="store_true",
                        help="METRICS_PORT=0 (the DaemonSet ships with metrics on)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.sample = 2.0, 1.0
    with tempfile.TemporaryDirectory(prefix="agent-idle-") as tmp:
        work = Path(tmp)
        metrics = {"METRICS_PORT": "0"} if args.metrics_off else {
            "METRICS_PORT": str(free_port()), "METRICS_ADDRESS": "127.0.0.1"}
        node = make_node(work, daemon_package(work / "pkg"), env=metrics)
        kmsg = node.root / "dev/kmsg"
        os.mkfifo(kmsg)
        reader = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
        writer = os.open(kmsg, os.O_WRONLY)  # held open: the agent's reads block, no EOF
        os.close(reader)
        baselines = {"python": subprocess.Popen([sys.executable, "-c",
                                                 "import time; time.sleep(1e9)"]),
                     "sleep": subprocess.Popen(["sleep", "infinity"])}
        cluster = kubefake.Cluster(nodes={NODE: kubefake.node_doc(NODE)})
        block = "" if args.with_rich else "sys.modules['rich'] = None; "
        launcher = [sys.executable, "-c", f"import sys; {block}from installer.cli import main; "
                    "sys.argv[0] = 'gpu-node-installer'; main()"]
        try:
            with kubefake.serve(cluster) as url:
                command = node.command("agent", api=url)
                log = open(node.root / "agent.log", "w")  # noqa: SIM115 (closed below)
                agent = subprocess.Popen(launcher + command[3:], env=node.env, cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT)
                try:
                    if not wait_ready(node, agent):
                        print(node.log()[-3000:], file=sys.stderr)
                        return 1
                    pids = {"agent": agent.pid, **{n: p.pid for n, p in baselines.items()}}
                    results = measure(pids, args.seconds, args.sample)
                    still_ready = node.view().get("ready") is True
                finally:
                    agent.terminate()
                    agent.wait(timeout=60)
                    log.close()
        finally:
            for process in baselines.values():
                process.kill()
                process.wait()
            os.close(writer)
    report = {"seconds": args.seconds, "load_average": os.getloadavg(), "rich": args.with_rich,
              "metrics": not args.metrics_off,
              "still_ready": still_ready, "api_calls": len(cluster.calls),
              "processes": results, "target_rss_mb": TARGET_RSS_MB,
              "target_met": results["agent"]["rss_max_mb"] <= TARGET_RSS_MB}
    failed = 1 if args.check and not report["target_met"] else 0
    if args.json:
        print(json.dumps(report, indent=2))
        return failed
    print(f"agent idle for {args.seconds:g} s (load average {os.getloadavg()[0]:.2f}); "
          f"still ready: {still_ready}; rich loaded: {args.with_rich}; API calls in all: "
          f"{len(cluster.calls)}; metrics: {'off' if args.metrics_off else 'on'}")
    print(f"{'process':<8} {'RSS max MB':>10} {'RSS last':>9} {'PSS':>6} {'private':>8} "
          f"{'CPU %':>7} {'CPU s':>6} {'wakeups/min':>12}")
    for name, row in results.items():
        print(f"{name:<8} {row['rss_max_mb']:>10} {row['rss_last_mb']:>9} {row['pss_mb']:>6} "
              f"{row['private_mb']:>8} {row['cpu_percent']:>7} {row['cpu_s']:>6} "
              f"{row['wakeups_per_min']:>12}")
    print(f"target: agent RSS <= {TARGET_RSS_MB:g} MB: "
          f"{'met' if report['target_met'] else 'NOT met'} ({results['agent']['rss_max_mb']} MB)")
    return failed


if __name__ == "__main__":
    sys.exit(main())
