"""Files that are not files: a FIFO, a device, a socket or a directory where a regular file
is expected (check-pod's manifest and `--node-labels`, `--aliases-from`, a shard's receipt,
a MIG config, gpu_config.json, os-release on the node).

One reader (`installer.node.files`) looks at the file before it opens it, opens it
non-blocking and checks it again, and reads at most its limit. Each case: the exit code of
its class within the test's 5 s (a FIFO read would block for ever, a device never end), one
line naming the file and what it is, nothing written in the arena.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from adversarial.harness import Arena, Result, refused_untouched, settle

CASE_S = 5


def _fifo(path: Path) -> str:
    os.mkfifo(path)  # no writer: an open for reading, or a read, would wait for ever
    return "is a FIFO (named pipe), not a regular file"


def _zero(path: Path) -> str:
    """/dev/zero's numbers, made inside the arena (the machine's /dev is never used)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod of a character device needs CAP_MKNOD")
    return "is a character device, not a regular file"


def _socket(path: Path) -> str:
    os.mknod(path, stat.S_IFSOCK | 0o600)
    return "is a socket, not a regular file"


def _directory(path: Path) -> str:
    path.mkdir()
    return "is a directory, not a regular file"


KINDS: dict[str, Callable[[Path], str]] = {
    "fifo": _fifo, "char device": _zero, "socket": _socket, "directory": _directory}


def _refused(arena: Arena, args: list[str], code: int, *causes: str) -> Result:
    return refused_untouched(arena, lambda: arena.run(*args, timeout=CASE_S), code, *causes)


@pytest.mark.parametrize("kind", KINDS)
def test_check_pod_manifest(arena: Arena, kind: str) -> None:
    path = arena.scene.work / "workload.yaml"
    cause = KINDS[kind](path)
    done = _refused(arena, ["check-pod", str(path)], 2, f"{path} {cause}")
    assert "- (stdin)" in done.lines[0]  # how to give a pipe instead


@pytest.mark.parametrize("kind", ["fifo", "char device"])
def test_check_pod_node_labels(arena: Arena, kind: str) -> None:
    pod = arena.scene.work / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n"
                   "  containers: [{name: c, image: cuda}]\n")
    labels = arena.scene.work / "node.yaml"
    cause = KINDS[kind](labels)
    _refused(arena, ["check-pod", str(pod), "--node-labels", str(labels)], 2,
             f"{labels} {cause}")


@pytest.mark.parametrize("kind", ["fifo", "char device", "socket"])
def test_aliases_from(arena: Arena, kind: str) -> None:
    """`--aliases-from /dev/zero` once grew memory without bound."""
    path = arena.scene.work / "aliases.json"
    cause = KINDS[kind](path)
    _refused(arena, ["package", "index", str(arena.scene.repo), "--aliases-from", str(path)],
             2, f"--aliases-from {path} {cause}")


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_receipt(arena: Arena, kind: str) -> None:
    """A receipt that is not a file is said to be so, not taken for a missing digest."""
    package = next(arena.scene.repo.glob("*/*/*/manifest.json")).parent
    relpath = package.relative_to(arena.scene.repo).as_posix()
    receipt = arena.scene.repo / ".receipts" / f"{relpath}.sha256"
    receipt.parent.mkdir(parents=True)
    cause = KINDS[kind](receipt)
    _refused(arena, ["package", "index", str(arena.scene.repo)], 7, f"{receipt} {cause}")


@pytest.mark.parametrize("kind", ["fifo", "char device"])
def test_mig_config_file(arena: Arena, kind: str) -> None:
    path = arena.scene.work / "mig.yaml"
    cause = KINDS[kind](path)
    settle(arena)
    _refused(arena, ["partition", "--dry-run", *arena.args("--mig-config-file", str(path),
                                                           "--mig-config", "all")],
             2, f"{path} {cause}")


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory"])
def test_gpu_config_json(arena: Arena, kind: str) -> None:
    path = arena.root / "etc/nvidia/gpu_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    cause = KINDS[kind](path)
    settle(arena)
    _refused(arena, ["partition", "--dry-run", *arena.args()], 2, f"{path} {cause}")


@pytest.mark.parametrize("kind", ["fifo", "char device"])
def test_node_file(arena: Arena, kind: str) -> None:
    """A file of the node the installer reads (os-release): exit 4, the path and its kind."""
    settle(arena)
    path = arena.root / "etc/os-release"
    path.unlink()
    cause = KINDS[kind](path)
    _refused(arena, ["detect", *arena.args()], 4, f"{cause}", "os-release")
