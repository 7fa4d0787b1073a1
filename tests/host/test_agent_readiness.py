"""Readiness that never says yes too early and never flaps, measured from outside.

The real `signal` and `agent` commands on the 8-GPU NVSwitch node and the L4 node of
tests/agentnode.py, sampled every 20 ms by a thread here: on a fabric node readiness (the
files, the label, the agent's view, `wait-ready`) appears only once every GPU's fabric has
completed, with the install's bytes; an API server that accepts and never answers (a real
socket on 127.0.0.1) never delays withdrawing readiness when Fabric Manager dies; an L4
node's agent starts and rollouts never withdraw it.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubefake
from agentnode import REPO, AgentNode, make_node, wait_for
from kubefake import Cluster
from kubefronts import HangingFront
from native.daemons import read_fabric_file, write_fabric

from installer.packages.manifest import Package

SAMPLE_S = 0.02
WITHDRAW_BOUND_S = 5.0  # the bound: a dead daemon's readiness gone, API hung
COMPLETED = (3, 0)


def label(cluster: Cluster) -> str | None:
    with cluster.lock:
        return cluster.node()["metadata"].get("labels", {}).get("gpu-node-installer/status")


def condition(cluster: Cluster) -> dict[str, Any]:
    with cluster.lock:
        return kubefake.conditions(cluster).get("gpu-node-installer/DriverReady", {})


def held(node: AgentNode) -> list[bytes]:
    work = node.install / ".agent"
    return [(work / name).read_bytes() for name in ("ready.json", "driver-ready.env")]


def fabric_done(node: AgentNode) -> bool:
    try:
        lines = read_fabric_file(node.fabric)
    except (OSError, ValueError):
        return False
    return bool(lines) and all(line == COMPLETED for line in lines)


@contextmanager
def sampled(sample: Callable[[], Any]) -> Iterator[list[Any]]:
    """`sample()` every SAMPLE_S in a thread while the block runs; the samples."""
    samples: list[Any] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            samples.append(sample())
            time.sleep(SAMPLE_S)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=5)


def before_fabric(samples: list[tuple[bool, bool]]) -> list[int]:
    """Samples with readiness published while some GPU's fabric was not done, up to the
    first publication (later, a stopping agent's Fabric Manager takes the fabric down)."""
    first = next((i for i, (published, _) in enumerate(samples) if published), len(samples))
    return [i for i in range(first, min(first + 1, len(samples))) if not samples[i][1]]


def early(node: AgentNode, api: Cluster | None = None) -> Callable[[], tuple[bool, bool]]:
    """A sample: (readiness published anywhere, every GPU's fabric done) -- readiness read
    first, the fabric after, so a sample (True, False) is readiness before the fabric."""
    def sample() -> tuple[bool, bool]:
        published = node.ready() or node.view().get("ready") is True or (
            api is not None and label(api) == "ready")
        return published, fabric_done(node)
    return sample


class TestFabricNodeBoot:
    """At an HGX boot `signal` runs before Fabric Manager: it must publish nothing."""

    def test_readiness_appears_only_once_every_gpu_fabric_completes(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, boot=True, env={"FAKE_FM_SECONDS": "2"})
        install = held(node)
        assert not node.ready() and label(api) is None
        waiter = subprocess.Popen(node.command("wait-ready", "--timeout", "90", "--interval",
                                               "0.05"), env=node.env, cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        waited_done: list[bool] = []

        def sample() -> tuple[bool, bool]:
            exited = waiter.poll() == 0
            published, done = early(node, api)()
            if exited and not waited_done:
                waited_done.append(done)
            return published or exited, done

        try:
            with sampled(sample) as samples, node.agent(api=url):
                wait_for(lambda: node.ready() and label(api) == "ready", 60, step=0.02)
                assert waiter.wait(timeout=30) == 0
                published = [p.read_bytes() for p in node.ready_files()]
        finally:
            if waiter.poll() is None:
                waiter.kill()
        assert len(samples) > 50 and any(not done for _, done in samples)  # saw the wait
        assert any(published for published, _ in samples)
        assert before_fabric(samples) == []  # never before the fabric
        assert waited_done == [True]  # wait-ready said yes only with the fabric done
        assert published == install  # the install's bytes
        assert any(e["reason"] == "DriverReady" for e in api.events)

    def test_signal_alone_waits_with_fabric_wait(self, tmp_path: Path,
                                                 package: Package) -> None:
        """No agent (a CI smoke test): `--fabric-wait` publishes once the fabric trains."""
        node = make_node(tmp_path, package, boot=True)

        def train() -> None:  # as Fabric Manager does, GPU by GPU
            time.sleep(1.0)
            states = [(2, 0)] * 8
            write_fabric(node.fabric, states)
            for index in range(8):
                time.sleep(0.1)
                states[index] = COMPLETED
                write_fabric(node.fabric, states)

        trainer = threading.Thread(target=train, daemon=True)
        with sampled(early(node)) as samples:
            trainer.start()
            done = node.run("signal", "--fabric-wait", "30", timeout=60)
        trainer.join(timeout=10)
        assert done.returncode == 0, done.stderr[-2000:]
        assert node.ready()
        assert before_fabric(samples) == [] and any(p for p, _ in samples)
        assert any(not d for _, d in samples)
        assert [p.read_bytes() for p in node.ready_files()] == held(node)

    def test_fabric_wait_that_passes_is_exit_12_naming_the_gpus(
            self, tmp_path: Path, package: Package) -> None:
        node = make_node(tmp_path, package, boot=True)
        write_fabric(node.fabric, [COMPLETED] * 7 + [(2, 0)])
        done = node.run("signal", "--fabric-wait", "1", timeout=30)
        assert done.returncode == 12, done.stderr[-2000:]
        lines = [line for line in done.stderr.splitlines() if line.startswith("error(")]
        assert len(lines) == 1 and "0000:cb:00.0 in-progress" in lines[0], done.stderr[-2000:]
        assert "fix:" in lines[0]
        assert not any(path.exists() for path in node.ready_files())
        assert held(node)  # kept for an agent
        status = node.run("status", timeout=30)  # says why a person sees no readiness
        assert "Ready:           no: no .ready.json in /home/kubernetes/bin/nvidia: the " \
               "install's readiness is held for the node agent" in status.stdout, status.stderr


class TestHungApiServer:
    """Fabric Manager killed at random points while the API server never answers."""

    def test_files_withdrawn_within_bound_then_api_converges(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        front = HangingFront(url)
        rng = random.Random(36)
        took: list[float] = []
        node = make_node(tmp_path, package, env={"FAKE_FM_SECONDS": "0.3"})
        try:
            # 5 agents x 4 kills (the supervisor's restart backoff doubles with each kill);
            # the last agent's fifth kill makes Fabric Manager "keep failing": not ready
            # for a minute, which the cluster must hear once the server answers
            for batch in range(5):
                with node.agent(api=front.url):
                    wait_for(lambda: node.ready() and label(api) == "ready", 60, step=0.02)
                    front.hung.set()
                    took += [self._trial(node, rng) for _ in range(4 + (batch == 4))]
                    if batch == 4:
                        assert label(api) == "ready"  # nothing got through while hung
                        front.hung.clear()
                        wait_for(lambda: label(api) == "not-ready" and condition(api).get(
                            "reason") == "DaemonFailing", 40)
                        assert "nv-fabricmanager keeps failing" in condition(api)["message"]
                    front.hung.clear()
        finally:
            front.close()
        print(f"withdrawn after FM killed, API hung: max {max(took):.3f}s, "
              f"median {statistics.median(took):.3f}s over {len(took)} trials")
        assert len(took) == 21 and max(took) <= WITHDRAW_BOUND_S, took

    @staticmethod
    def _trial(node: AgentNode, rng: random.Random) -> float:
        wait_for(lambda: node.ready() and node.pid("nv-fabricmanager") is not None, 60,
                 step=0.02)
        time.sleep(rng.uniform(0.0, 1.0))  # a random point of the agent's wait
        pid = node.pid("nv-fabricmanager")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        while node.ready():
            assert time.monotonic() - start < 20, "readiness never withdrawn"
            time.sleep(0.01)
        return time.monotonic() - start


class TestL4Node:
    """No fabric: persistenced's start is no failure, so readiness never goes away."""

    def test_starts_and_rollouts_never_withdraw_readiness(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1)
        withdrawn: list[str] = []
        seen_ready = threading.Event()

        def sample() -> None:
            status = condition(api).get("status")
            lab = label(api)
            if lab == "ready" and status == "True":
                seen_ready.set()  # the first agent's first report complete
            if not node.ready():
                withdrawn.append("files")
            if seen_ready.is_set() and (lab != "ready" or status != "True"):
                withdrawn.append(f"label={lab} condition={status}")

        with sampled(sample) as samples:
            for start in range(13):  # 10 starts (stop, start again), then 3 rollouts
                with node.agent(api=url) as agent:
                    wait_for(lambda: node.view().get("ready") is True, 60, step=0.02)
                    wait_for(lambda: label(api) == "ready", 30, step=0.02)
                    assert agent.poll() is None
                if start < 10:
                    time.sleep(0.3)
        assert len(samples) > 100
        assert withdrawn == []
        assert node.ready() and label(api) == "ready"


class TestHeldCopy:
    def test_a_malformed_held_copy_is_never_published(self, tmp_path: Path,
                                                      package: Package) -> None:
        node = make_node(tmp_path, package, boot=True)
        write_fabric(node.fabric, [COMPLETED] * 8)  # the fabric is no reason to wait
        (node.install / ".agent/ready.json").write_bytes(b"[not json")
        done = node.run("agent", "--once", timeout=60)
        assert done.returncode == 12, done.stderr[-2000:]
        lines = [line for line in done.stderr.splitlines() if line.startswith("error(")]
        assert len(lines) == 1 and "held readiness" in lines[0] and "malformed" in lines[0]
        assert not any(path.exists() for path in node.ready_files())
