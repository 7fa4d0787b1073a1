"""A live upgrade (upgrade/flow.py) stops the driver's daemons before it unloads:
the daemons hold the GPUs, and the new pod's agent starts the new version's.

The node serves V1 with a GPU pod (the simulated kernel of tests/fakenode.py) and a
persistence daemon left running with its pid file on the node and the record of its start
in the agent's work area (a real process: the daemon stand-in of tests/native/daemons.py,
started through the seam as the agent starts it; a process without that record would
never be signalled). `install` of V2 with UPGRADE_POLICY=evict against the
strict fake API must stop that daemon through its pid file (SIGTERM, its process gone, the
pid file removed) while V1 is still loaded, then evict, unload and install V2.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import kubefake
from e2e import Scene, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer
from kubefake import Cluster, node_doc, pod_doc
from native.daemons import write_daemon_standins

from installer.installdir.layout import AGENT_DIR
from installer.node import daemons, programs
from installer.node.host import RealHost, Roots
from installer.testing.kernel import FakeKernelHost

V1, V2 = "535.261.03", "535.309.01"
NODE = "gpu-node-1"
UID = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
CGROUP = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
          f"{UID.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope\n")


def test_the_upgrade_stops_the_daemons_before_it_unloads(tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    add_version(scene, V1)
    add_version(scene, V2)
    root = scene.root
    write_daemon_standins(root / "opt/standins", version=V1)
    pid_file = root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    daemon: subprocess.Popen[bytes] | None = None
    try:
        with MirrorServer(scene.repo) as mirror:
            base = ["--mirror", mirror.url, "--allow-http", "--output", "json"]
            first = run_cli(["install", *scene.args(*base, "--driver-version", V1)],
                            standin_env(V1))
            assert first.returncode == 0, first.stderr
            daemon = start_persistenced(scene, tmp_path / "persistenced.log")
            kernel = FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))
            holder = kernel.open_device("nvidia", "/dev/nvidia0", "python3", CGROUP)
            cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                              pods={"default/train": pod_doc("train", UID, NODE)})
            stopped_while: list[int | None] = []

            def kubelet(pod: dict[str, object]) -> None:  # the pod's process exits
                stopped_while.append(daemon.poll() if daemon else None)  # stopped before this?
                kernel.close_device(holder)

            cluster.on_evict = kubelet
            account = tmp_path / "serviceaccount"
            account.mkdir()
            (account / "token").write_text(kubefake.TOKEN + "\n")
            with kubefake.serve(cluster) as api:
                done = run_cli(["install", *scene.args(
                    *base, "--driver-version", V2, "--upgrade-policy", "evict",
                    "--node-name", NODE, "--kube-api", api,
                    "--service-account-dir", str(account))], standin_env(V2))
        assert done.returncode == 0, done.stderr
        assert cluster.errors == []
        assert stopped_while == [0]  # SIGTERM'd (exit 0) before the GPU pod was evicted
        assert not pid_file.exists()
        assert V2 in (root / "proc/driver/nvidia/version").read_text()
    finally:
        if daemon is not None:
            if daemon.poll() is None:
                daemon.kill()
            daemon.wait()


def start_persistenced(scene: Scene, log_file: Path) -> subprocess.Popen[bytes]:
    """The persistence daemon as the agent starts it: exec'd from its hashed descriptor,
    its start recorded in the agent's work area; returned once it runs."""
    root = scene.root
    binary = root / "opt/standins/nvidia-persistenced"
    node = RealHost(Roots(root, root / "proc", root / "sys", root / "dev"))
    program = programs.open_program(node, binary,
                                    hashlib.sha256(binary.read_bytes()).hexdigest())
    try:
        daemon = daemons.start_daemon(
            node, "nvidia-persistenced", [str(binary), "--persistence-mode", "-f"],
            program=program, log_file=log_file,
            records=scene.install_dir / AGENT_DIR / "daemons",
            env={**os.environ, "FAKE_DAEMON_ROOT": str(root)}).process
    finally:
        program.close()
    deadline = time.monotonic() + 30
    while "started" not in log_file.read_text():  # its SIGTERM handler is in place
        assert time.monotonic() < deadline and daemon.poll() is None
        time.sleep(0.05)
    return daemon
