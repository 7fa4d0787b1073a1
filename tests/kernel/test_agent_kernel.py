"""On a real kernel: SIGTERM stops the node agent and its daemons within the pod's
grace period.

The node is built on this side (tests/agentnode.py) in the out dir the guest shares; one
guest boot runs tests/kernel/agent_guest.py: the real `agent` command with the daemon
stand-ins, the guest kernel's own processes, pidfds and /dev/kmsg. The tests assert on what
the guest recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from agentnode import daemon_package, make_node

from . import guest
from .assets import Kernel
from .conftest import REPO

pytestmark = pytest.mark.timeout(900)
GRACE_S = 45  # the DaemonSet's terminationGracePeriodSeconds


@pytest.fixture(scope="module")
def guest_run(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("agent-kernel")
    node = make_node(out, daemon_package(tmp_path_factory.mktemp("agent-pkg")))
    spec = {"root": str(node.root), "env": {**node.env, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}}
    (out / "node.json").write_text(json.dumps(spec))
    script = (f"set -e\nip link set lo up\n"
              f'"{sys.executable}" tests/kernel/agent_guest.py "{out / "node.json"}" '
              f'"$GNI_OUT/results.json"\n')
    result = guest.run_in_guest(script, kernel=kernel, timeout=600, cwd=REPO,
                                env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}, out_dir=out)
    assert result.rc == 0, result.describe()
    data: dict[str, Any] = result.json("results.json")
    assert data["ready"], (data["view"], data["log"][-10:])
    return data


class TestSigtermInTheGuest:
    def test_the_daemons_ran_as_the_agent_started_them(self, guest_run: dict[str, Any]
                                                       ) -> None:
        fm = guest_run["cmdlines"]["nv-fabricmanager"]  # the stand-ins are ELF programs
        assert Path(fm[0]).name == "nv-fabricmanager" and fm[1] == "-c"
        assert guest_run["cmdlines"]["nvidia-persistenced"][1:] == [
            "--persistence-mode", "--foreground"]
        assert guest_run["view"]["fabric_kind"] == "nvswitch"

    def test_sigterm_stops_the_agent_and_its_daemons_within_the_grace_period(
            self, guest_run: dict[str, Any]) -> None:
        assert guest_run["exit_code"] == 0
        assert guest_run["stop_s"] < GRACE_S
        assert guest_run["alive_after"] == []
        assert guest_run["pid_files_after"] == {"nv-fabricmanager": None,
                                                "nvidia-persistenced": None}

    def test_readiness_is_left_as_the_node_really_is(self, guest_run: dict[str, Any]) -> None:
        assert guest_run["ready_after"] is False  # no Fabric Manager: not ready
        assert guest_run["view_after"] is False
        events = [line["event"] for line in guest_run["log"]]
        assert "node ready" in events and events[-1] == "agent stopped"
