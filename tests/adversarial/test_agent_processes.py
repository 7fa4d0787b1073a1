"""Whose process is it? The agent adopts, and anything signals, only a daemon it provably
started: the record of that start in its work area names the pid, the process's start time
and boot, and the program exec'd, and `/proc/PID/exe` is the staged binary. A pid file is
only a number anyone may write (or a FIFO that would hang the reader).

Each case runs `agent --once` on an NVSwitch node in the sandbox (tests/adversarial/agentkit)
within 5 s and asserts the outcome, the line naming the real cause, that nothing outside
the agent's own files changed, and that the foreign process named like the daemon is alive
(never signalled) while our daemon was started.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agentnode import AgentNode

from adversarial.agentkit import (
    FM_PID,
    alive,
    arena_snapshot,
    events,
    foreign,
    run_once,
    start_ticks,
    untouched,
    write_record,
)
from adversarial.harness import Result, assert_refused
from installer.node import daemons, programs
from installer.node.host import RealHost, Roots


def plant_pid(node: AgentNode, pid: int) -> None:
    path = node.root.parent / FM_PID
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid}\n")


def not_adopted(result: Result, why: str) -> None:
    found = [e for e in events(result, "pid file names no daemon of ours: not adopted")
             if e.get("daemon") == "nv-fabricmanager"]
    assert found and why in str(found[0]["why"]), found


def ours_started_and_ready(node: AgentNode, result: Result) -> None:
    started = [e for e in events(result, "daemon started")
               if e.get("daemon") == "nv-fabricmanager"]
    assert started and "nv-fabricmanager" in node.started()
    assert result.code == 0 and "fabric complete" in result.stdout, result.stderr[-2000:]
    assert not any(line.startswith("error(") for line in result.lines)


def test_a_foreign_process_named_like_the_daemon_is_not_adopted_nor_signalled(
        node: AgentNode, tmp_path: Path) -> None:
    """The pid file names a copy of `sleep` called nv-fabricmanager (argv and program name
    say so): no record of ours, so it is not adopted; ours starts; --once stops only ours."""
    with foreign(tmp_path / "outside") as other:
        plant_pid(node, other.pid)
        before = arena_snapshot(node)
        done = run_once(node)
        ours_started_and_ready(node, done)
        not_adopted(done, "this installer has no record of starting it")
        assert alive(other.pid), "the foreign process was signalled"
        untouched(node, before)


def test_a_recycled_pid_is_not_ours_though_the_record_names_it(
        node: AgentNode, tmp_path: Path) -> None:
    """The record names the pid, but the process there started at another time: the pid
    was recycled for a foreign process. Not adopted, not signalled."""
    with foreign(tmp_path / "outside") as other:
        plant_pid(node, other.pid)
        write_record(node, "nv-fabricmanager", pid=other.pid,
                     start_ticks=start_ticks(other.pid) - 1)
        before = arena_snapshot(node)
        done = run_once(node)
        ours_started_and_ready(node, done)
        not_adopted(done, "started at another time than the nv-fabricmanager recorded "
                          "(a recycled pid)")
        assert alive(other.pid)
        untouched(node, before)


def test_a_record_matching_a_process_that_runs_another_program(
        node: AgentNode, tmp_path: Path) -> None:
    """Pid, start time and boot all match (a forged record), but /proc/PID/exe is the copy
    of sleep, not the staged binary: not adopted, not signalled."""
    with foreign(tmp_path / "outside") as other:
        plant_pid(node, other.pid)
        write_record(node, "nv-fabricmanager", pid=other.pid,
                     start_ticks=start_ticks(other.pid))
        before = arena_snapshot(node)
        done = run_once(node)
        ours_started_and_ready(node, done)
        not_adopted(done, f"pid {other.pid} does not run the program nv-fabricmanager was "
                          "started from")
        assert alive(other.pid)
        untouched(node, before)


def test_a_fifo_as_the_pid_file_is_named_and_never_waited_on(node: AgentNode) -> None:
    """A FIFO where the pid file goes would hang a plain read forever: read non-blocking,
    regular files only; Fabric Manager is not started over it (exit 12 naming the FIFO)."""
    fifo = node.root.parent / FM_PID
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    before = arena_snapshot(node)
    done = run_once(node)
    assert_refused(done, 12, "node not ready: nv-fabricmanager not started",
                   f"its pid file {fifo} is a FIFO (named pipe), not a regular file",
                   "remove it")
    not_adopted(done, "is a FIFO (named pipe), not a regular file")
    assert "nv-fabricmanager" not in node.started()
    assert fifo.is_fifo()  # not ours: left as found
    untouched(node, before)


def test_the_upgrade_stop_never_signals_a_foreign_process(node: AgentNode,
                                                          tmp_path: Path) -> None:
    """What the upgrade flow calls before it unloads: every pid file names a copy of sleep
    named like its daemon, one with a forged record of the wrong start time. None is ours."""
    host = RealHost(Roots(node.root, node.root / "proc", node.root / "sys", node.root / "dev"))
    with foreign(tmp_path / "outside") as fm, \
            foreign(tmp_path / "outside2", "nvidia-persistenced") as persistenced:
        plant_pid(node, fm.pid)
        path = daemons.pid_file(host, "nvidia-persistenced")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{persistenced.pid}\n")
        records = write_record(node, "nvidia-persistenced", pid=persistenced.pid,
                               start_ticks=start_ticks(persistenced.pid) + 7).parent
        assert daemons.stop_all(host, timeout_s=1, records=records) == []
        assert alive(fm.pid) and alive(persistenced.pid)
        assert path.is_file() and (node.root.parent / FM_PID).is_file()  # left as found
        with pytest.raises(daemons.NotOurs, match="a recycled pid"):
            daemons.check_ours(persistenced.pid, "nvidia-persistenced", records)
        assert programs.exe_identity(fm.pid) is not None
