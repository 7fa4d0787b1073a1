"""What the agent's next-kernel watch reads on the node, made hostile: a /lib/modules entry
that links out of the host root (to a complete kernel tree there), names that are no kernel
release (`9..9`, a space, 200 characters), boot links that point out of /boot or out of the
root. The real agent runs in the suite's sandbox (every mount but the arena read-only) on
the L4 node of tests/agentnode.py with the stand-in `prepare` first on its PATH: each entry
is ignored with one log line naming it, no `prepare` runs (its record, outside the host
root, never appears), no next kernel is said, and nothing outside the agent's own files
changes. The agent is stopped by SIGTERM after its first round, within the case's bound.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from agentnode import REPO, make_node
from nextkernels import add_tree
from prepare_standin import standin_env, write_prepare_standin

from adversarial.agentkit import AGENT_WRITES
from adversarial.harness import SANDBOX_FAILED, assert_untouched, sandboxed, snapshot
from installer.packages.manifest import Package

START_S = 30.0  # the agent's start on a busy machine (imports, planning, persistenced)
CASE_S = 5.0  # from its first view: the round's decisions and its stop
LONG = "9" * 200


def test_hostile_kernel_entries_are_ignored_and_run_nothing(
        tmp_path: Path, agent_package: Package) -> None:
    base = tmp_path / "arena"
    record = base / "outside" / "prepare-ran.jsonl"
    write_prepare_standin(base / "bin")
    node = make_node(base, agent_package, sample="debian12-l4", gpus=1,
                     env=standin_env(base / "bin", record))
    root = node.root
    add_tree(base / "outside", "9.9.9-1-amd64")  # complete, newer, outside the root
    add_tree(root, "6.1.0-26-cloud-amd64")  # the running kernel's own tree
    (root / "lib/modules/9.9.9-1-amd64").symlink_to(base / "outside/lib/modules/9.9.9-1-amd64")
    (root / "lib/modules/9.9.9-3-amd64").symlink_to("../../../outside/lib/modules/9.9.9-1-amd64")
    for name in ("9..9-amd64", "9.9 9", LONG):
        add_tree(root, name)
    (root / "vmlinuz").symlink_to("../outside/boot/vmlinuz-9.9.9-2-amd64")
    (root / "boot").mkdir(exist_ok=True)
    (root / "boot/vmlinuz").symlink_to("/etc/vmlinuz-9.9.9-4-amd64")
    before = snapshot(base)
    (base / "tmp").mkdir()
    log = base / "tmp" / "agent.log"
    with open(log, "w") as out:
        agent = subprocess.Popen(sandboxed(base, *node.command("agent")),
                                 env={**node.env, "TMPDIR": str(base / "tmp")}, cwd=REPO,
                                 stdout=out, stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + START_S
            while "next_kernel" not in node.view():
                assert agent.poll() is None, log.read_text()[-2000:]
                assert agent.poll() != SANDBOX_FAILED
                assert time.monotonic() < end, "the agent did not start"
                time.sleep(0.05)
            assert node.view()["next_kernel"] is None
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=CASE_S)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    events = [json.loads(line) for line in log.read_text().splitlines()
              if line.startswith("{")]
    ignored = {e["path"]: e["reason"] for e in events
               if e.get("event") == "next kernel: entry ignored"}
    link = "is a symbolic link, not a modules tree"
    not_release = "is no kernel release name"
    assert ignored == {
        "/lib/modules/9.9.9-1-amd64": link, "/lib/modules/9.9.9-3-amd64": link,
        "/lib/modules/9..9-amd64": not_release, "/lib/modules/9.9 9": not_release,
        f"/lib/modules/{LONG[:80]}": not_release,
        "/vmlinuz": "points at '../outside/boot/vmlinuz-9.9.9-2-amd64', "
                    "not /boot/vmlinuz-<release>",
        "/boot/vmlinuz": "points at '/etc/vmlinuz-9.9.9-4-amd64', not /boot/vmlinuz-<release>",
    }
    assert not record.exists()  # no prepare ran, for any name
    assert not [e for e in events if e.get("event") == "next kernel preparation started"]
    assert_untouched(before, snapshot(base), (*AGENT_WRITES, "tmp/"))
