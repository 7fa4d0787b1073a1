"""Preparing the next kernel (installer.agent.nextprepare, installer.node.background) with
the stand-in `prepare` of tests/prepare_standin.py: run under nice 19 and the idle I/O class,
one at a time, never waited on; its answer judged (ready, missing, failed; garbage, huge,
hanging -> failed, bounded); outcomes remembered, failures retried with backoff."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from nextkernels import NEXT, Log, add_tree, host_tree
from prepare_standin import standin_env, write_prepare_standin

from installer.agent.nextkernel import NextKernel, describe
from installer.agent.nextprepare import (
    FAILED_RETRY_S,
    MISSING_RETRY_S,
    Preparer,
    prepare_command,
)
from installer.config import Config
from installer.testing import SAMPLE_NODES, build_node

BOUND_S = 5.0  # every case ends within this (a hanging stand-in is killed)


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    write_prepare_standin(tmp_path / "bin")
    return {"bin": tmp_path / "bin", "record": tmp_path / "record.jsonl",
            "work": tmp_path / "work",
            "config": Config(host_root=tmp_path / "node", proc_root=tmp_path / "node/proc",
                             sys_root=tmp_path / "node/sys", dev_root=tmp_path / "node/dev")}


def preparer(node: dict[str, Any], mode: str, **settings: Any) -> tuple[Preparer, Log]:
    log = Log()
    config = dataclasses.replace(node["config"], **settings)
    env = {**os.environ, **standin_env(node["bin"], node["record"], mode)}
    return Preparer(config, env, node["work"], log), log


def runs(node: dict[str, Any]) -> list[dict[str, Any]]:
    path: Path = node["record"]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def settle(prep: Preparer, kernel: str | None, now: float = 0.0) -> tuple[str, Any]:
    """Tick until the preparation ends (bounded)."""
    end = time.monotonic() + BOUND_S
    state, outcome = prep.tick(kernel, now)
    while prep.job is not None:
        assert time.monotonic() < end, "prepare not done within the bound"
        time.sleep(0.02)
        state, outcome = prep.tick(kernel, now)
    return state, outcome


class TestCommand:
    def test_the_command_line(self, node: dict[str, Any]) -> None:
        env = standin_env(node["bin"], node["record"])
        argv, environ = prepare_command(node["config"], NEXT, env)
        assert argv == ["nice", "-n", "19", "ionice", "-c", "3",
                        str(node["bin"] / "gpu-node-installer"),
                        "prepare", "--kernel", NEXT, "-o", "json"]
        assert environ["HOST_ROOT"] == str(node["config"].host_root)
        assert environ["FAKE_PREPARE"] == "ready"  # the agent's own environment passed on

    def test_without_the_console_script_this_interpreter_runs_the_module(
            self, node: dict[str, Any]) -> None:
        argv, _ = prepare_command(node["config"], NEXT, {"PATH": str(node["work"])})
        assert argv[6:9] == [sys.executable, "-m", "installer"]


class TestStates:
    def test_ready_runs_at_idle_priority_once(self, node: dict[str, Any]) -> None:
        prep, _ = preparer(node, "ready")
        assert prep.tick(NEXT, 0.0)[0] == "building"  # started, not waited on
        state, outcome = settle(prep, NEXT)
        assert state == "ready" and outcome.driver_version == "535.261.03"
        [run] = runs(node)
        assert run["argv"][1:] == ["prepare", "--kernel", NEXT, "-o", "json"]
        assert run["nice"] == 19 and run["ionice"].startswith("idle")
        assert run["host_root"] == str(node["config"].host_root)
        assert prep.tick(NEXT, 10 ** 6) == ("ready", outcome)  # never prepared again
        assert len(runs(node)) == 1
        said = describe(NEXT, state, outcome, "default")
        assert said.reason == "DriverReady" and NEXT in said.message
        assert "535.261.03" in said.message

    def test_missing_names_the_build_command_and_asks_again_later(
            self, node: dict[str, Any]) -> None:
        prep, _ = preparer(node, "missing")
        state, outcome = settle(prep, NEXT)
        assert state == "missing"
        said = describe(NEXT, state, outcome, "default")
        assert said.reason == "DriverMissing"
        assert f"gpu-node-installer package build --kernel {NEXT}" in said.message
        assert prep.tick(NEXT, MISSING_RETRY_S - 1)[0] == "missing"
        assert len(runs(node)) == 1
        assert prep.tick(NEXT, MISSING_RETRY_S)[0] == "missing"  # asked again, still said
        assert prep.job is not None
        settle(prep, NEXT, MISSING_RETRY_S)
        assert len(runs(node)) == 2

    def test_a_missing_kernel_published_later_turns_ready(self, node: dict[str, Any]) -> None:
        prep, _ = preparer(node, "missing")
        assert settle(prep, NEXT)[0] == "missing"
        prep.environ = {**prep.environ, "FAKE_PREPARE": "ready"}  # a mirror published it
        state, outcome = settle(prep, NEXT, MISSING_RETRY_S)
        assert state == "ready" and outcome.build_command is None
        assert len(runs(node)) == 2

    def test_failed_is_retried_with_a_doubling_backoff(self, node: dict[str, Any]) -> None:
        prep, _ = preparer(node, "failed")
        state, outcome = settle(prep, NEXT, 0.0)
        assert state == "failed" and "503" in outcome.error
        first, _ = FAILED_RETRY_S
        assert prep.tick(NEXT, first - 1)[0] == "failed" and len(runs(node)) == 1
        settle(prep, NEXT, first)
        assert len(runs(node)) == 2
        assert prep.tick(NEXT, first + 2 * first - 1)[0] == "failed"
        assert len(runs(node)) == 2
        settle(prep, NEXT, first + 2 * first)
        assert len(runs(node)) == 3


class TestHostileOutput:
    """Whatever `prepare` prints or does, the outcome is failed, with the reason, bounded."""

    @pytest.mark.parametrize(("mode", "reason"), [
        ("garbage", "without one JSON object on stdout"),
        ("huge", "more than 65536 bytes"),
        ("wrong-kernel", "answered for kernel '5.10.0-1-amd64'"),
        ("hang", "was killed (NEXT_KERNEL_PREPARE_TIMEOUT)"),
    ])
    def test_failed_and_bounded(self, node: dict[str, Any], mode: str, reason: str) -> None:
        prep, _ = preparer(node, mode, next_kernel_prepare_timeout=1.0)
        started = time.monotonic()
        state, outcome = settle(prep, NEXT)
        assert time.monotonic() - started < BOUND_S
        assert state == "failed" and reason in outcome.error, outcome
        [run] = runs(node)
        assert not Path(f"/proc/{run['pid']}").exists() or \
            Path(f"/proc/{run['pid']}/stat").read_text().split(") ")[1][0] in "ZX"

    def test_a_program_that_cannot_start(self, node: dict[str, Any]) -> None:
        prep, _ = preparer(node, "ready")
        prep.environ = {"PATH": str(node["work"] / "empty")}  # no nice, no console script
        state, outcome = prep.tick(NEXT, 0.0)
        assert state == "failed" and outcome.error.startswith("cannot start nice")


class TestOneAtATime:
    def test_a_new_next_kernel_stops_the_running_preparation(
            self, node: dict[str, Any]) -> None:
        prep, log = preparer(node, "ready,sleep=30")
        assert prep.tick(NEXT, 0.0)[0] == "building"
        end = time.monotonic() + BOUND_S
        while not runs(node):
            assert time.monotonic() < end
            time.sleep(0.02)
        first = runs(node)[0]["pid"]
        assert prep.tick("6.1.0-59-amd64", 1.0)[0] == "building"
        assert not Path(f"/proc/{first}").exists()  # killed and reaped before the next
        assert prep.tick(None, 2.0) == ("", None)  # no next kernel: nothing runs
        assert prep.job is None
        assert log.events("next kernel preparation stopped: the next kernel changed")


class TestNothingForOtherNames:
    def test_hostile_entries_run_nothing(self, node: dict[str, Any], tmp_path: Path) -> None:
        root = tmp_path / "node"
        host = host_tree(root)
        add_tree(root, "9..9-amd64")
        (root / "lib/modules/9.9.9-1-amd64").symlink_to(tmp_path / "outside")
        (root / "vmlinuz").symlink_to("/etc/vmlinuz-9.9.9-2-amd64")
        env = {**os.environ, **standin_env(node["bin"], node["record"])}
        watch = NextKernel(node["config"], host, env, Log(), work=node["work"])
        for now in (0.0, 1.0, 2.0):
            assert not watch.tick(now) or watch.said is None
        assert watch.said is None and runs(node) == []
        watch.close()


class TestRealCommand:
    """The real `prepare` through the very command line the agent builds: its answer keeps
    the contract (one JSON object, a state its exit code agrees with, for this kernel)."""

    def test_a_kernel_no_source_has(self, tmp_path: Path) -> None:
        root = build_node(tmp_path / "node", SAMPLE_NODES["debian12-l4"])
        add_tree(root, "6.1.0-27-cloud-amd64")
        config = Config(host_root=root, proc_root=root / "proc", sys_root=root / "sys",
                        dev_root=root / "dev")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "NVIDIA_"))}
        env["PATH"] = str(tmp_path / "no-console-script") + os.pathsep + "/usr/bin:/bin"
        prep = Preparer(config, env, tmp_path / "work", Log())
        end = time.monotonic() + 120
        state, outcome = prep.tick("6.1.0-27-cloud-amd64", 0.0)
        while state == "building":
            assert time.monotonic() < end
            time.sleep(0.1)
            state, outcome = prep.tick("6.1.0-27-cloud-amd64", 0.0)
        assert state == "missing", outcome  # no mirror, nothing preloaded or cached: exit 5
        assert outcome.build_command is not None
        assert "package build" in outcome.build_command
        assert "linux-headers-6.1.0-27-cloud-amd64" in outcome.build_command
        said = describe("6.1.0-27-cloud-amd64", state, outcome, config.driver_version)
        assert f"build it: {outcome.build_command}"[:200] in said.message
