"""The agent's arena: a node built by tests/agentnode.py (the daemon stand-ins staged from
the package) inside a temp dir, `outside/` beside it (data and programs not the node's), and
`agent --once` run in the suite's sandbox (every mount but the arena read-only).

What an agent run may change in the arena: its work area and view, the readiness files it
withdraws or restores, the daemons' pid files, logs and fabric file, the termination log.
Everything else (the staged version, `outside/`) is compared before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentnode import INSTALL, REPO, AgentNode, make_node

from adversarial.harness import SANDBOX_FAILED, Result, assert_untouched, sandboxed, snapshot
from installer.node.daemons import read_pid
from installer.packages.manifest import Package

CASE_S = 5.0  # every case's bound
FM_PID = "node/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
AGENT_WRITES = (f"node/{INSTALL}/.agent", f"node/{INSTALL}/.ready.json",
                "node/run/nvidia/validations/", "node/var/",
                "node/fabric", "node/termlog", "node/persistence", "tmp/")


def agent_node(base: Path, package: Package) -> AgentNode:
    """A single-NVSwitch-node arena under `base` whose fabric trains in a moment."""
    node = make_node(base, package, env={"FAKE_FM_SECONDS": "0.2"})
    (base / "outside").mkdir()
    (base / "outside" / "sentinel.conf").write_text("not the node's\n")
    return node


def run_once(node: AgentNode, env: dict[str, str] | None = None) -> Result:
    """`agent --once` in the sandbox (with `env` added), within CASE_S."""
    arena = node.root.parent
    (arena / "tmp").mkdir(exist_ok=True)
    command = sandboxed(arena, *node.command("agent", "--once"))
    done = subprocess.run(command, env={**node.env, **(env or {}), "TMPDIR": str(arena / "tmp")},
                          cwd=REPO, capture_output=True, text=True, timeout=CASE_S, check=False,
                          errors="replace")
    assert done.returncode != SANDBOX_FAILED, f"sandbox not set up: {done.stderr[-500:]}"
    return Result(done.returncode, done.stdout, done.stderr)


def staged(node: AgentNode, name: str) -> Path:
    """The daemon's staged binary (the real file behind `.current`)."""
    return (node.install / ".current/bin" / name).resolve()


def untouched(node: AgentNode, before: dict[str, tuple[str, int, str]]) -> None:
    assert_untouched(before, snapshot(node.root.parent), AGENT_WRITES)


def arena_snapshot(node: AgentNode) -> dict[str, tuple[str, int, str]]:
    return snapshot(node.root.parent)


def events(result: Result, name: str) -> list[dict[str, object]]:
    return [e for e in result.events if e.get("event") == name]


@contextmanager
def foreign(directory: Path, name: str = "nv-fabricmanager"
            ) -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not ours, named like the daemon: a copy of `sleep` called `name`
    (its argv[0] and its program both say so); killed at the end by the test that made it."""
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / name
    shutil.copyfile(shutil.which("sleep") or "/bin/sleep", program)
    program.chmod(0o755)
    process = subprocess.Popen([str(program), "300"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except OSError:
        return False
    return state not in "ZX"


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])


def write_record(node: AgentNode, name: str, **fields: object) -> Path:
    """A record of a start in the agent's work area, as the agent writes one."""
    binary = staged(node, name)
    info = binary.stat()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    record = {"pid": 0, "start_ticks": 0, "boot_id": boot, "dev": info.st_dev,
              "ino": info.st_ino, "sha256": hashlib.sha256(binary.read_bytes()).hexdigest(),
              "program": str(binary), **fields}
    path = node.install / ".agent/daemons" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def kill_standins(node: AgentNode) -> None:
    """Whatever stand-in a failed case left running: only a process whose program lies in
    this node's tree (never another). Pid files read as the agent reads them (a FIFO a case
    planted must not hang the teardown)."""
    for path in (node.root / "var/run").glob("*/*.pid"):
        try:
            pid = read_pid(path)
            if pid is not None and os.readlink(f"/proc/{pid}/exe").startswith(str(node.root)):
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
