"""What the agent executes: the staged daemon binary, opened inside the host root, hashed
from that descriptor against the sha256 the stage recorded, and exec'd through the
descriptor, never through a path. A binary rewritten in place, replaced by a link (to a
program outside the host root), by a FIFO, or reached through a directory linked outside
the root, never runs: the daemon is not started and the line names why.

Each case runs `agent --once` on an NVSwitch node in the sandbox (tests/adversarial/agentkit)
within 5 s: exit 12 (not ready) with the one line naming the real cause, the program outside
the root never ran (its sentinel is absent), nothing changed outside the agent's own files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from agentnode import AgentNode

from adversarial.agentkit import (
    arena_snapshot,
    events,
    run_once,
    staged,
    untouched,
)
from adversarial.harness import assert_refused

NOT_STARTED = "node not ready: nv-fabricmanager not started"


def evil_program(node: AgentNode) -> tuple[str, Path]:
    """A program that, if it ever ran, would write a sentinel outside the host root."""
    sentinel = node.root.parent / "outside" / "ran"
    return f"#!/bin/sh\necho escaped > {sentinel}\nexec sleep 300\n", sentinel


def the_path(node: AgentNode) -> str:
    return str(node.install / ".current/bin/nv-fabricmanager")


def refused(node: AgentNode, before: dict[str, tuple[str, int, str]], *causes: str) -> None:
    done = run_once(node)
    assert_refused(done, 12, NOT_STARTED, *causes)
    assert [e["why"] for e in events(done, "daemon not started")] == [
        done.lines[0].split(": ", 3)[-1].split("; fix:")[0]]
    assert "nv-fabricmanager" not in node.started()
    untouched(node, before)


def test_a_binary_rewritten_in_place_is_not_run(node: AgentNode) -> None:
    """Same inode, other bytes (what `cp` over the file or an editor's save does)."""
    text, sentinel = evil_program(node)
    binary = staged(node, "nv-fabricmanager")
    with binary.open("r+b") as handle:
        handle.truncate(0)
        handle.write(text.encode())
    before = arena_snapshot(node)
    refused(node, before, f"{the_path(node)} has sha256", "the package staged",
            "changed since it was staged")
    assert not sentinel.exists()


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_a_binary_replaced_by_a_link_is_not_followed(node: AgentNode, target: str) -> None:
    """A link to a program outside the host root (absolute: it would escape it if followed
    from here), or inside it: the staged program is a regular file, never a link."""
    text, sentinel = evil_program(node)
    outside = node.root.parent / "outside" / "nv-fabricmanager"
    outside.write_text(text)
    outside.chmod(0o755)
    binary = staged(node, "nv-fabricmanager")
    binary.unlink()
    binary.symlink_to(outside if target == "absolute" else os.path.relpath(outside,
                                                                             binary.parent))
    before = arena_snapshot(node)
    refused(node, before, f"{the_path(node)} is a symbolic link, not the staged program")
    assert not sentinel.exists()


def test_a_binary_replaced_by_a_fifo_is_not_waited_on(node: AgentNode) -> None:
    binary = staged(node, "nv-fabricmanager")
    binary.unlink()
    os.mkfifo(binary)
    before = arena_snapshot(node)
    refused(node, before, f"{the_path(node)} is a FIFO (named pipe), not the staged program")


def test_a_record_without_the_binarys_sha256_is_not_trusted(node: AgentNode) -> None:
    """A `.staged.json` from before the hash was recorded: nothing to check against, so
    nothing runs; the fix is to stage again."""
    meta_path = staged(node, "nv-fabricmanager").parent.parent / ".staged.json"
    meta = json.loads(meta_path.read_text())
    del meta["daemons"]["nv-fabricmanager"]["sha256"]
    meta_path.write_text(json.dumps(meta))
    before = arena_snapshot(node)
    refused(node, before, f"no sha256 is recorded for {the_path(node)}",
            "staged by an older installer")


def test_a_bin_directory_linked_outside_the_root_resolves_inside_it(node: AgentNode) -> None:
    """`bin -> /…/outside/bin` (absolute): resolved in the host root, where nothing is, never
    to the programs outside. Neither daemon starts (a missing file: retried, and the line
    names the first, persistenced)."""
    text, sentinel = evil_program(node)
    evil_bin = node.root.parent / "outside" / "bin"
    evil_bin.mkdir()
    shutil.copytree(staged(node, "nv-fabricmanager").parent, evil_bin, dirs_exist_ok=True)
    (evil_bin / "nv-fabricmanager").write_text(text)
    real_bin = staged(node, "nv-fabricmanager").parent
    real_bin.rename(real_bin.with_name("bin.aside"))
    real_bin.symlink_to(evil_bin)
    before = arena_snapshot(node)
    done = run_once(node, env={"FABRIC_TIMEOUT": "2"})
    persistenced = the_path(node).replace("nv-fabricmanager", "nvidia-persistenced")
    assert_refused(done, 12, "node not ready: nvidia-persistenced is not running",
                   f"cannot start {persistenced}: No such file or directory")
    assert not sentinel.exists()
    assert node.started() == []
    untouched(node, before)
