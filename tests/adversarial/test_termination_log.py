"""The termination log: written only where the kubelet made it, or where
TERMINATION_LOG names it; never by the commands a person runs by hand to look at a node.

Each case runs the real CLI in the sandbox, asserts the exit code and the one line, and lists
the arena before and after.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import node_args

from adversarial.harness import (
    VERSION,
    Arena,
    assert_refused,
    assert_untouched,
    run_wrapped,
    settle,
)

# /dev of the sandbox is an arena folder holding the few device nodes a run uses, so the
# real default path /dev/termination-log is what the CLI sees, and the arena listing shows
# whether it was created or changed.
DEVICES = ("null", "zero", "full", "random", "urandom")
DEV = """
dev=$1; shift
for name in null zero full random urandom; do
  mount --bind "/dev/$name" "$dev/$name" || exit 96
done
mount --rbind "$dev" /dev || exit 96
exec "$@"
"""


def _private_dev(arena: Arena) -> Path:
    dev = arena.base / "dev"
    dev.mkdir()
    for name in DEVICES:
        (dev / name).touch()
    return dev


def _bad_pod(arena: Arena) -> Path:
    pod = arena.scene.work / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
                   "  - name: c\n    image: cuda\n    resources: {limits: "
                   "{nvidia.com/gpu: 'two'}}\n")
    return pod


def _looking(arena: Arena) -> dict[str, tuple[list[str], int, str]]:
    """Commands run by hand that fail (a broken node after the config loaded, a bad setting,
    version or workload): their arguments, exit code and cause."""
    (arena.root / "etc" / "os-release").write_text("this is not os-release\n")
    node = [*node_args(arena.root), "--log-format", "json"]
    return {
        "detect": (["detect", *node], 4, "/etc/os-release line 1"),
        "status": (["status", *node, "--lock-timeout", "-1"], 2, "--lock-timeout='-1'"),
        "versions": (["versions", *node, "--driver-version", "x"], 2, "--driver-version='x'"),
        "compat": (["compat", "--cuda", "nope", "--driver", VERSION], 2, "--cuda 'nope'"),
        "check-pod": (["check-pod", str(_bad_pod(arena)), *node], 14, "rule(s) fail"),
        "preflight": (["preflight", "--kernel", "no kernel"], 2, "--kernel 'no kernel'"),
    }


@pytest.mark.parametrize("kubelet", [False, True], ids=["no log", "kubelet's log"])
def test_12_looking_commands_never_write_the_termination_log(arena: Arena, kubelet: bool
                                                             ) -> None:
    """Item 12: check-pod, compat, detect, preflight, status, versions and --help, run by
    hand as root, neither create /dev/termination-log nor overwrite one the kubelet
    provided."""
    dev = _private_dev(arena)
    if kubelet:
        (dev / "termination-log").write_text("")
    settle(arena)
    looking = _looking(arena)
    before = arena.snapshot()
    for args, code, cause in looking.values():
        assert_refused(run_wrapped(arena, DEV, [str(dev)], *args), code, cause)
    assert run_wrapped(arena, DEV, [str(dev)], "--help").code == 0
    assert_untouched(before, arena.snapshot())


@pytest.mark.parametrize("kubelet", [False, True], ids=["no log", "kubelet's log"])
def test_12_install_writes_the_log_only_where_the_kubelet_made_it(arena: Arena, kubelet: bool
                                                                  ) -> None:
    """Item 12: a failing `install` without TERMINATION_LOG writes /dev/termination-log
    when the file exists (a container), and never creates it (a laptop, a node)."""
    dev = _private_dev(arena)
    if kubelet:
        (dev / "termination-log").write_text("")
    before = arena.snapshot()
    done = run_wrapped(arena, DEV, [str(dev)], "install", *node_args(arena.root),
                        "--log-format", "json", "--download-retries", "0")
    assert_refused(done, 2, "--download-retries")
    if kubelet:
        assert (dev / "termination-log").read_text() == done.lines[0] + "\n"
        assert_untouched(before, arena.snapshot(), ("dev/termination-log",))
    else:
        assert not (dev / "termination-log").exists()
        assert_untouched(before, arena.snapshot())


def test_12_explicit_termination_log_is_created(arena: Arena) -> None:
    """Item 12: TERMINATION_LOG set explicitly is created when missing (the operator asked)."""
    log = arena.scene.work / "explicit-log"
    before = arena.snapshot()
    done = arena.run("install", *node_args(arena.root), "--log-format", "json",
                     "--download-retries", "0", env={"TERMINATION_LOG": str(log)})
    assert_refused(done, 2, "--download-retries")
    assert log.read_text() == done.lines[0] + "\n"
    assert_untouched(before, arena.snapshot())  # work/ (the log's folder) is the run's own
