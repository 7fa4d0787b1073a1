"""The next kernel, end to end: the real `agent` on the L4 node of tests/agentnode.py, the
stand-in `prepare` of tests/prepare_standin.py first on its PATH, the strict fake API.

A second kernel's modules tree appears: the agent sees it (inotify: at its next round; the
issue's bound is a minute), runs `prepare` for it under nice 19 and the idle I/O class, and
says the state in the node label, the NextKernelReady condition, an Event per change, the
metric, its view and `status`; it stages and loads nothing for that kernel. A kernel older
than the running one, and NEXT_KERNEL_PREPARE=off, run nothing. With the real `prepare`
(TestRealPrepare), NEXT's package comes from a test mirror into the host cache, verified.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import kubefake
import pytest
from agentnode import AgentNode, make_node, wait_for
from helpers import http_get
from httpserver import MirrorServer
from kubefake import Cluster
from native import build_standins
from native.packages import standin_tree
from nextkernels import add_tree
from prepare_standin import standin_env, write_prepare_standin
from prometheus_client.parser import text_string_to_metric_families

from installer.packages.builder import BuildRequest, build
from installer.packages.manifest import Package
from installer.testing.kernel import fake_module_set

RUNNING = "6.1.0-26-cloud-amd64"  # the debian12-l4 sample's kernel
VERSION = "535.261.03"  # the staged stand-in driver's
NEXT = "6.1.0-27-cloud-amd64"
OLDER = "6.1.0-25-cloud-amd64"
DETECT_BOUND_S = 60.0  # the "within a minute"
LABEL = "gpu-node-installer/next-kernel"
CONDITION = "gpu-node-installer/NextKernelReady"
EXPECTED = {  # stand-in mode -> label, condition status and reason, Event reason
    "ready": ("ready", "True", "DriverReady", "NextKernelReady"),
    "missing": ("missing", "False", "DriverMissing", "NextKernelDriverMissing"),
    "failed": ("failed", "False", "PrepareFailed", "NextKernelPrepareFailed"),
}


def add_for_kernel(work: Path, repo: Path, version: str, kernel: str) -> str:
    """A package of `version` for `kernel` in `repo` (as tests/host/test_prepare.py builds
    one); returns its manifest digest."""
    tree = standin_tree(work / "tree", build_standins(work / "built"), version)
    fake_module_set(work / "modules", version, kernel_release=kernel)
    return build(BuildRequest(trees=(tree,), modules_dir=work / "modules",
                              driver_version=version, kernel_release=kernel,
                              flavour="open", repo=repo, aliases=("default", "latest"),
                              force=True)).digest


def node_with_standin(tmp_path: Path, package: Package, mode: str, **env: str
                      ) -> tuple[AgentNode, Path]:
    record = tmp_path / "prepare-runs.jsonl"
    write_prepare_standin(tmp_path / "bin")
    node = make_node(tmp_path, package, sample="debian12-l4", gpus=1,
                     env={**standin_env(tmp_path / "bin", record, mode), **env})
    add_tree(node.root, RUNNING)
    return node, record


def runs(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()] \
        if record.exists() else []


def label(api: Cluster) -> str | None:
    with api.lock:
        return api.node()["metadata"].get("labels", {}).get(LABEL)


def condition(api: Cluster) -> dict[str, Any]:
    with api.lock:
        return dict(kubefake.conditions(api).get(CONDITION, {}))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def next_kernel_series(base: str) -> dict[tuple[str, str], float]:
    """gpu_node_installer_next_kernel_ready by (kernel, state), as served ({} if none)."""
    try:
        status, text = http_get(base + "/metrics")
    except OSError:
        return {}
    if status != 200:
        return {}
    return {(s.labels["kernel"], s.labels["state"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "gpu_node_installer_next_kernel_ready"}


def said(node: AgentNode) -> Any:
    return node.view().get("next_kernel", "absent")


def tree_files(root: Path) -> dict[str, int]:
    """Every file under `root` but the agent's own view and work area, with its size."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".agent") and ".agent/" not in str(p)}


class TestStates:
    @pytest.mark.parametrize("mode", list(EXPECTED))
    def test_a_second_kernel_is_prepared_and_said(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster],
            mode: str) -> None:
        url, api = cluster
        port = free_port()
        node, record = node_with_standin(
            tmp_path, package, f"{mode},sleep=1.5", METRICS_PORT=str(port),
            METRICS_ADDRESS="127.0.0.1", METRICS_INTERVAL="1",
            POD_RESOURCES_DIR=str(tmp_path / "no-pod-resources"))
        base = f"http://127.0.0.1:{port}"
        staged = tree_files(node.install)
        with node.agent(api=url) as agent:
            wait_for(lambda: said(node) is None, 60)  # watching; nothing newer yet
            assert label(api) is None and not runs(record)
            add_tree(node.root, NEXT)
            detected = wait_for(lambda: said(node) not in (None, "absent"), DETECT_BOUND_S)
            print(f"next kernel detected {detected:.1f}s after its tree appeared")
            assert said(node)["kernel"] == NEXT
            wait_for(lambda: label(api) == "building", 30)  # stand-in sleeps 1.5 s first
            want_label, status, reason, event = EXPECTED[mode]
            wait_for(lambda: label(api) == want_label, 60)
            wait_for(lambda: condition(api).get("reason") == reason, 30)
            found = condition(api)
            assert found["status"] == status and NEXT in found["message"]
            assert "535.261.03" in found["message"]
            if mode == "missing":
                assert f"build it: gpu-node-installer package build --kernel {NEXT}" \
                    in found["message"]
            assert said(node)["state"] == want_label
            reasons = [e["reason"] for e in api.events if e["reason"].startswith("NextKernel")]
            assert reasons[:2] == ["NextKernelPreparing", event]
            status_out = node.run("status")
            line = next(x for x in status_out.stdout.splitlines()
                        if x.startswith("Next kernel:"))
            assert f"{want_label}: kernel {NEXT}" in line
            wait_for(lambda: (NEXT, want_label) in next_kernel_series(base), 30)
            assert next_kernel_series(base) == {(NEXT, want_label): float(mode == "ready")}
            assert agent.poll() is None
        [run] = runs(record)  # one run: the outcome is remembered
        assert run["argv"][1:] == ["prepare", "--kernel", NEXT, "-o", "json"]
        assert run["nice"] == 19 and run["ionice"].startswith("idle")
        assert run["host_root"] == str(node.root)
        assert tree_files(node.install) == staged  # nothing staged for the next kernel
        assert not (node.root / "proc/modules").exists() or \
            NEXT not in (node.root / "proc/modules").read_text()

    def test_the_label_goes_when_the_kernel_does(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node, _ = node_with_standin(tmp_path, package, "ready")
        tree = add_tree(node.root, NEXT)
        with node.agent(api=url):
            wait_for(lambda: label(api) == "ready", 60)
            for path in sorted(tree.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            tree.rmdir()
            wait_for(lambda: label(api) is None and not condition(api), 60)
            assert said(node) is None


class TestStop:
    def test_a_stopping_agent_kills_its_preparation(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        """The pod is deleted mid-build: nothing the agent started outlives it."""
        url, api = cluster
        node, record = node_with_standin(tmp_path, package, "hang")
        add_tree(node.root, NEXT)
        with node.agent(api=url) as agent:
            wait_for(lambda: runs(record) and label(api) == "building", 60)
            pid = runs(record)[0]["pid"]
            assert Path(f"/proc/{pid}").exists()
            agent.terminate()
            agent.wait(timeout=30)
        assert not Path(f"/proc/{pid}").exists()


class TestAfterTheReboot:
    def test_a_label_an_earlier_boot_left_goes(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        """The node rebooted into the kernel it prepared: no next kernel now, so the label
        and condition the last boot's agent set are removed (only those: ours)."""
        url, api = cluster
        node, record = node_with_standin(tmp_path, package, "ready")
        with api.lock:
            metadata = api.node()["metadata"]
            metadata.setdefault("labels", {})[LABEL] = "ready"
            metadata["labels"]["team"] = "gpu"
            api.node().setdefault("status", {}).setdefault("conditions", []).append(
                {"type": CONDITION, "status": "True", "reason": "DriverReady",
                 "message": f"kernel {RUNNING}: driver 535.261.03 ready"})
        with node.agent(api=url):
            wait_for(lambda: label(api) is None and not condition(api), 60)
            assert said(node) is None and not runs(record)
        with api.lock:
            assert api.node()["metadata"]["labels"]["team"] == "gpu"


class TestNothingRun:
    def test_an_older_kernel_is_ignored(self, tmp_path: Path, package: Package,
                                        cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node, record = node_with_standin(tmp_path, package, "ready")
        add_tree(node.root, OLDER)
        with node.agent(api=url):
            wait_for(lambda: said(node) is None, 60)
            time.sleep(2)  # rounds go by
            assert said(node) is None and label(api) is None and not runs(record)
        assert '"event": "next kernel: ignored"' in node.log()
        assert OLDER in node.log()

    def test_off_watches_and_runs_nothing(self, tmp_path: Path, package: Package,
                                          cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node, record = node_with_standin(tmp_path, package, "ready",
                                         NEXT_KERNEL_PREPARE="off")
        add_tree(node.root, NEXT)
        with node.agent(api=url):
            wait_for(lambda: node.view().get("ready") is not None, 60)
            time.sleep(2)
            assert said(node) == "absent" and label(api) is None and not runs(record)
            status_out = node.run("status")
            assert "Next kernel:     not watched (NEXT_KERNEL_PREPARE=off)" in status_out.stdout


class TestRealPrepare:
    """The agent with the real `prepare` (no stand-in on PATH): a second kernel the test
    mirror has is fetched into the host cache, verified, and said `ready`; one no source
    has is said `missing`, with the build command the real command names."""

    def test_a_kernel_the_mirror_has_is_cached_verified_and_ready(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        repo = tmp_path / "repo"
        digest = add_for_kernel(tmp_path / "pkg-next", repo, VERSION, NEXT)
        with MirrorServer(repo) as server:
            node = make_node(tmp_path, package, sample="debian12-l4", gpus=1,
                             env={"PATH": "/usr/bin:/bin", "DRIVER_MIRRORS": server.url,
                                  "DRIVER_ALLOW_HTTP": "true",
                                  "NVIDIA_DRIVER_VERSION": VERSION})
            add_tree(node.root, RUNNING)
            staged = tree_files(node.install)
            modules = (node.root / "proc/modules").read_bytes()
            add_tree(node.root, NEXT)
            with node.agent(api=url):
                wait_for(lambda: label(api) in ("ready", "missing", "failed"), 120)
                assert label(api) == "ready", (condition(api), node.log()[-3000:])
                wait_for(lambda: condition(api).get("reason") == "DriverReady", 30)
                message = condition(api)["message"]  # kernel, driver, source and digest
                assert NEXT in message and VERSION in message and "(from mirror, " in message
                assert said(node)["state"] == "ready"
                reasons = [e["reason"] for e in api.events
                           if e["reason"].startswith("NextKernel")]
                assert reasons[:2] == ["NextKernelPreparing", "NextKernelReady"]
                line = next(x for x in node.run("status").stdout.splitlines()
                            if x.startswith("Next kernel:"))
                assert f"ready: kernel {NEXT}" in line
            served = [r.path for r in server.requests if f"/{NEXT}/" in r.path]
        assert served, "NEXT's package came from the test mirror"
        [ref] = [json.loads(p.read_text()) for p in (node.install / ".cache/refs").glob("*")]
        assert (ref["kernel_release"], ref["digest"]) == (NEXT, digest)
        assert digest[:12] in message  # the verified package is the one the mirror holds
        # nothing loaded, staged or written for NEXT outside the cache and the prepare lock
        assert {k: v for k, v in tree_files(node.install).items()
                if not k.startswith((".cache/", ".prepare.lock"))} == staged
        assert (node.root / "proc/modules").read_bytes() == modules

    def test_a_kernel_no_source_has_is_missing(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1,
                         env={"PATH": "/usr/bin:/bin", "DRIVER_MIRRORS": ""})
        add_tree(node.root, RUNNING)
        add_tree(node.root, NEXT)
        with node.agent(api=url):
            wait_for(lambda: label(api) == "missing", 90)
            wait_for(lambda: condition(api).get("reason") == "DriverMissing", 30)
            message = condition(api)["message"]
        assert f"kernel {NEXT}: no package" in message
        assert f"linux-headers-{NEXT}" in message  # the real command's build command
        assert '"event": "next kernel preparation started"' in node.log()

