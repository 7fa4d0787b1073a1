"""Runs inside the guest: the live driver upgrade against the real kernel, results as JSON.

The installer runs as the DaemonSet would run it (`python -m installer install`, RealHost on
the guest's /, /proc, /sys, /dev), the strict fake API server (tests/kubefake.py) listens on
the guest's 127.0.0.1, and GPU "workloads" are real processes holding /dev/nvidia0 open,
placed in cgroups named as kubelet and containerd name them (cgroup v2, systemd driver). The
fake API server plays kubelet: when it evicts the pod, it kills that pod's process.

Scenarios, in order on one kernel: V1 installed; a holder outside any pod blocks (PID
named); a pod holder whose PodDisruptionBudget never allows → timeout, V1 still loaded, node
cordoned; the budget relents → the rerun evicts, swaps the modules for real, reaches ready
and uncordons; then a device-plugin-like DaemonSet pod holds V2, its controller
recreates it the moment it is deleted, and the new process reopens /dev/nvidia* as soon as
the device files exist (it polls as GKE's plugin does): the upgrade back to V1 must still
swap the modules and end upgrade-done, the new plugin opening V1 only once it is ready.
Usage: python tests/kernel/upgrade_guest.py ARGS.json OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kubefake
from kubefake import Cluster, DaemonSet, add_daemonset, node_doc, pod_doc

NODE = "gpu-node-1"
UID = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
CID = "4f1e7c0b6d5a3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f"
CGROUP = Path("/sys/fs/cgroup")
POD_CGROUP = (CGROUP / "kubepods.slice/kubepods-burstable.slice"
              / f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
              / f"cri-containerd-{CID}.scope")
HOST_CGROUP = CGROUP / "system.slice/gpu-monitor.service"
PLUGIN_UID = "9f8e7d6c-5b4a-4321-8fed-cba987654321"
READY = Path("/home/kubernetes/bin/nvidia/.ready.json")
# GKE's device plugin start-up (cmd/nvidia_gpu): stat /dev/nvidiactl and /dev/nvidia-uvm
# until both exist (every 5 s there; 50 ms here), then open the driver and keep it open.
# It writes what it found when it opened: the loaded driver and the ready file's version.
PLUGIN = ("import json, os, sys, time\n"
          "open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()))\n"
          "while not (os.path.exists('/dev/nvidiactl') and os.path.exists('/dev/nvidia-uvm')):\n"
          "    time.sleep(0.05)\n"
          "fds = [os.open(d, os.O_RDWR) for d in ('/dev/nvidiactl', '/dev/nvidia0')]\n"
          "ready = sys.argv[3]\n"
          "seen = {'driver': open('/sys/module/nvidia/version').read().strip(),\n"
          "        'ready': json.load(open(ready))['driver_version']\n"
          "        if os.path.exists(ready) else None}\n"
          "tmp = sys.argv[2] + '.tmp'\n"
          "open(tmp, 'w').write(json.dumps(seen))\n"
          "os.replace(tmp, sys.argv[2])\n"
          "time.sleep(900)\n")
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


def daemonset_cgroup(uid: str) -> Path:
    """A BestEffort pod's container cgroup, as kubelet and containerd name it."""
    return (CGROUP / "kubepods.slice/kubepods-besteffort.slice"
            / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
            / f"cri-containerd-{CID}.scope")


def plugin(pod: dict[str, Any]) -> tuple[subprocess.Popen[str], Path]:
    """Start the device-plugin stand-in for `pod`; it writes its findings to the path."""
    uid = pod["metadata"]["uid"]
    cgroup = daemonset_cgroup(uid)
    cgroup.mkdir(parents=True, exist_ok=True)
    seen = WORK / f"plugin-{uid}.json"
    proc = subprocess.Popen([sys.executable, "-c", PLUGIN, str(cgroup), str(seen),
                             str(READY)], text=True)
    return proc, seen


def wait_file(path: Path, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return dict(json.loads(path.read_text()))
        time.sleep(0.1)
    return None


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


def upgrade(args: dict[str, Any], api: str, *extra: str, to: str = "v2") -> dict[str, Any]:
    return install(args, args[to], "--upgrade-policy", "evict", "--node-name", NODE,
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
        out.update(device_plugin(args, cluster, pods, api))
    out["modules"] = sorted(line.split()[0] for line in
                            Path("/proc/modules").read_text().splitlines())
    return out


def device_plugin(args: dict[str, Any], cluster: Cluster, pods: dict[str, Any], api: str
                  ) -> dict[str, Any]:
    """GKE's device plugin holds V2 and comes straight back when deleted."""
    seen: dict[str, Path] = {}

    def start(pod: dict[str, Any]) -> None:  # kubelet starts the recreated pod
        pods[pod["metadata"]["name"]], seen[pod["metadata"]["name"]] = plugin(pod)

    daemonset = DaemonSet("kube-system", "nvidia-gpu-device-plugin", recreate_after=0,
                          on_create=start)
    start(add_daemonset(cluster, daemonset, uid=PLUGIN_UID))
    first = wait_file(seen[daemonset.made[0]], 30)
    calls = len(cluster.calls)
    done = upgrade(args, api, "--upgrade-restart-daemonsets", "--upgrade-timeout", "60",
                   to="v1")  # back to V1: the swap is as real in either direction
    back = daemonset.made[1] if len(daemonset.made) > 1 else None
    return {"plugin_first": first, "plugin_made": list(daemonset.made),
            "plugin_cgroup": str(daemonset_cgroup(PLUGIN_UID).relative_to(CGROUP)),
            "plugin_back": wait_file(seen[back], 60) if back else None,
            "plugin_done": done, "plugin_cluster": snapshot(cluster),
            "plugin_calls": [asdict(c) | {"body": None} for c in cluster.calls[calls:]],
            "plugin_nodes": sorted(p.name for p in Path("/dev").glob("nvidia*"))}


if __name__ == "__main__":
    arguments = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(main(arguments), indent=1))
