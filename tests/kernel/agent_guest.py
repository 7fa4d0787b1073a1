"""Runs inside the guest: the node agent under a real kernel, stopped by SIGTERM.

The host side built the node (tests/agentnode.py: the stand-in driver staged and made ready
by the real `signal`, the daemon stand-ins as the package's daemons) inside the out dir,
which the guest mounts at the same path. Here, on the guest's real kernel (its own PID
namespace, /proc, pidfds) and its real /dev/kmsg as the Xid source: start `agent`, wait
until it reports the fabric complete, SIGTERM it as the kubelet does, and record how long it
took, whether its daemons' processes are gone and what it left on the node.
Usage: python tests/kernel/agent_guest.py NODE.json OUT.json
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentnode import AgentNode

from installer.node import daemons

NAMES = ("nv-fabricmanager", "nvidia-persistenced")


def wait(what: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def main(spec: dict[str, Any]) -> dict[str, Any]:
    node = AgentNode(Path(spec["root"]), spec["env"])
    out: dict[str, Any] = {}
    log = open(node.root / "agent.log", "w")  # noqa: SIM115 (closed below)
    agent = subprocess.Popen([*node.command("agent"), "--dev-root", "/dev"], env=node.env,
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        out["ready"] = wait(lambda: node.view().get("ready") is True, 300)
        out["view"] = node.view()
        pids = {name: node.pid(name) for name in NAMES}
        out["cmdlines"] = {name: daemons.command_line(pid) if pid else []
                           for name, pid in pids.items()}
        start = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        out["exit_code"] = agent.wait(timeout=120)
        out["stop_s"] = time.monotonic() - start
        out["alive_after"] = [name for name, pid in pids.items()
                              if pid and daemons.command_line(pid)]
        out["pid_files_after"] = {name: node.pid(name) for name in NAMES}
        out["ready_after"] = node.ready()
        out["view_after"] = (node.install / ".agent.json").exists()
    finally:
        if agent.poll() is None:
            agent.kill()
        log.close()
    out["log"] = [json.loads(line) for line in node.log().splitlines()
                  if line.startswith("{")]
    return out


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(main(spec), indent=1))
