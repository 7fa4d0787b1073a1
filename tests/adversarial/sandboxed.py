"""A small arena and a probe program run in it, sandboxed like the CLI cases (harness.py).

For the agent's long-running parts (the Xid reader, the metrics collector and server),
which no one-shot CLI command runs: `healthprobe.py` drives the real modules in a
subprocess inside the same read-only-but-the-arena mount namespace, and prints what it
saw as JSON. The test asserts on that, on the one log line naming the cause, and on a
listing of the arena before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from healthkit import host_tree

from adversarial.harness import SANDBOX_FAILED, Entry, sandboxed, snapshot

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("healthprobe.py")


@dataclass
class SmallArena:
    """`node` (a host tree whose sysfs lists GPUs), `outside` (not ours), `work`."""

    base: Path

    @property
    def node(self) -> Path:
        return self.base / "node"

    def listing(self) -> dict[str, Entry]:
        return snapshot(self.base)


def small_arena(base: Path, gpus: tuple[str, ...] | None = None) -> SmallArena:
    arena = SmallArena(base)
    if gpus is None:
        host_tree(arena.node)
    else:
        host_tree(arena.node, gpus)
    (base / "outside/etc").mkdir(parents=True)
    (base / "outside/etc/sentinel.conf").write_text("not the installer's\n")
    (base / "work").mkdir()
    return arena


def command(arena: SmallArena, *args: str) -> list[str]:
    return sandboxed(arena.base, sys.executable, str(PROBE), *args)


def environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    import os

    keep = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "METRICS_"))}
    return {**keep, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", **(extra or {})}


@dataclass
class Probe:
    code: int
    result: dict[str, Any]
    events: list[dict[str, Any]]
    stderr: str


def run_probe(arena: SmallArena, *args: str, env: dict[str, str] | None = None,
              timeout: float = 5) -> Probe:
    """Run the probe to its end (bounded by `timeout`); its JSON result and log events."""
    done = subprocess.run(command(arena, *args), capture_output=True, text=True,
                          env=environ(env), timeout=timeout, check=False)
    assert done.returncode != SANDBOX_FAILED, f"sandbox not set up: {done.stderr[-500:]}"
    return parse(done.returncode, done.stdout, done.stderr)


def parse(code: int, stdout: str, stderr: str) -> Probe:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return Probe(code, result, events, stderr)


@contextmanager
def started(arena: SmallArena, *args: str, env: dict[str, str] | None = None
            ) -> Iterator[subprocess.Popen[str]]:
    """A long-running probe (the metrics server); stopped (stdin closed, then killed) at
    the end of the block."""
    process = subprocess.Popen(command(arena, *args), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environ(env))
    try:
        yield process
    finally:
        if process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
