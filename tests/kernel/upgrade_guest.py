"""Runs inside the guest: issue 16's driver upgrade against the real kernel, results as JSON.

The installer runs as the DaemonSet would run it (`python -m installer install`, RealHost on
the guest's /, /proc, /sys, /dev), the strict fake API server (tests/kubefake.py) listens on
the guest's 127.0.0.1, and GPU "workloads" are real processes holding /dev/nvidia0 open,
placed in cgroups named as kubelet and containerd name them (cgroup v2, systemd driver). The
fake API server plays kubelet: when it evicts the pod, it kills that pod's process.

Scenarios, in order on one kernel: V1 installed; a holder outside any pod blocks (PID
named); a pod holder whose PodDisruptionBudget never allows → timeout, V1 still loaded, node
cordoned; the budget relents → the rerun evicts, swaps the modules for real, reaches ready
and uncordons. Usage: python tests/kernel/upgrade_guest.py ARGS.json OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kubefake
from kubefake import Cluster, node_doc, pod_doc

NODE = "gpu-node-1"
UID = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
CID = "4f1e7c0b6d5a3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f"
CGROUP = Path("/sys/fs/cgroup")
POD_CGROUP = (CGROUP / "kubepods.slice/kubepods-burstable.slice"
              / f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
              / f"cri-containerd-{CID}.scope")
HOST_CGROUP = CGROUP / "system.slice/gpu-monitor.service"
WORK = Path("/tmp/gni-upgrade")
HOLD = ("import os, sys, time\n"
        "open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()))\n"
        "fd = os.open('/dev/nvidia0', os.O_RDWR)\n"
        "print('open', flush=True)\n"
        "time.sleep(900)\n")


def holder(cgroup: Path, name: str) -> subprocess.Popen[str]:
    """A process in `cgroup` holding /dev/nvidia0 open (a CUDA job stand-in)."""
    cgroup.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(cgroup), name],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    return proc


def loaded() -> str:
    path = Path("/sys/module/nvidia/version")
    return path.read_text().strip() if path.exists() else "none"


def install(args: dict[str, Any], version: str, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "installer", "install", "--host-root", "/", "--proc-root",
            "/proc", "--sys-root", "/sys", "--dev-root", "/dev", "--mirror",
            f"file://{args['repo']}", "--driver-version", version,
            "--termination-log", str(WORK / "termination-log"), "--log-format", "json",
            "--output", "json", *extra]
    env = {**os.environ, "FAKE_NVML_DRIVER": version, "FAKE_CUDA_DEVICES": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    ready = Path("/home/kubernetes/bin/nvidia/.ready.json")
    return {"rc": done.returncode, "stdout": done.stdout,
            "errors": [line for line in done.stderr.splitlines() if '"error"' in line][-3:],
            "stderr_tail": done.stderr.splitlines()[-6:], "loaded": loaded(),
            "ready": json.loads(ready.read_text()) if ready.exists() else None}


def upgrade(args: dict[str, Any], api: str, *extra: str) -> dict[str, Any]:
    return install(args, args["v2"], "--upgrade-policy", "evict", "--node-name", NODE,
                   "--kube-api", api, "--service-account-dir", str(WORK / "sa"), *extra)


def snapshot(cluster: Cluster) -> dict[str, Any]:
    node = cluster.node()
    return {"steps": cluster.steps(), "states": cluster.states(),
            "observed": [c.observed for c in cluster.calls
                         if c.method in ("PATCH", "DELETE") or c.path.endswith("/eviction")],
            "unschedulable": bool(node["spec"].get("unschedulable")),
            "labels": node["metadata"].get("labels", {}),
            "annotations": node["metadata"].get("annotations", {}),
            "events": [{k: e[k] for k in ("reason", "message", "type")}
                       for e in cluster.events],
            "errors": list(cluster.errors), "pods": sorted(cluster.pods)}


def main(args: dict[str, Any]) -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "sa").mkdir(exist_ok=True)
    (WORK / "sa" / "token").write_text(kubefake.TOKEN + "\n")
    subprocess.run(["mount", "-t", "cgroup2", "none", str(CGROUP)], check=True)
    out: dict[str, Any] = {"v1": install(args, args["v1"])}
    pods: dict[str, subprocess.Popen[str]] = {}
    cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                      pods={"default/train": pod_doc("train", UID, NODE)}, observe=loaded)

    def kubelet(pod: dict[str, Any]) -> None:
        proc = pods.pop(pod["metadata"]["name"], None)
        if proc is not None:  # the pod's container is stopped, as kubelet would
            proc.kill()
            proc.wait()

    cluster.on_evict = kubelet
    with kubefake.serve(cluster) as api:
        monitor = holder(HOST_CGROUP, "gpu-monitor")
        out["host_holder_pid"] = monitor.pid
        out["host_holder_cgroup"] = Path(f"/proc/{monitor.pid}/cgroup").read_text()
        out["blocked"] = upgrade(args, api)
        out["blocked_cluster"] = snapshot(cluster)
        out["host_holder_alive"] = monitor.poll() is None
        monitor.kill()  # the operator stops the host process (the installer never does)
        monitor.wait()
        pods["train"] = holder(POD_CGROUP, "train")
        out["pod_holder_pid"] = pods["train"].pid
        out["pod_holder_cgroup"] = Path(f"/proc/{pods['train'].pid}/cgroup").read_text()
        cluster.evictions["default/train"] = [429] * 100000  # a PDB that never allows
        out["pdb"] = upgrade(args, api, "--upgrade-timeout", "4")
        out["pdb_cluster"] = snapshot(cluster)
        out["pdb_holder_alive"] = pods["train"].poll() is None
        cluster.evictions["default/train"] = []  # the budget allows now: 201
        first = len(cluster.calls)
        out["done"] = upgrade(args, api, "--upgrade-timeout", "120")
        out["done_cluster"] = snapshot(cluster)
        out["done_calls"] = [asdict(c) | {"body": None} for c in cluster.calls[first:]]
    out["modules"] = sorted(line.split()[0] for line in
                            Path("/proc/modules").read_text().splitlines())
    return out


if __name__ == "__main__":
    arguments = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(main(arguments), indent=1))
