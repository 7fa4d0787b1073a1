"""The harness itself: a good install passes, and the checks catch what they must."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from adversarial.harness import (
    SANDBOX_FAILED,
    VERSION,
    Arena,
    Result,
    assert_refused,
    assert_untouched,
    sandboxed,
)


def test_a_good_install_reaches_ready(arena: Arena) -> None:
    repo = f"file://{arena.scene.repo}"
    done = arena.run("install", *arena.args("--mirror", repo, "--driver-version", VERSION))
    assert done.code == 0, done.stderr[-2000:]
    assert (arena.install_dir / ".ready.json").is_file()


def test_a_bad_setting_touches_nothing(arena: Arena) -> None:
    before = arena.snapshot()
    done = arena.run("install", *arena.args("--driver-version", "5 3 5"))
    assert_refused(done, 2, "--driver-version", "5 3 5")
    assert_untouched(before, arena.snapshot())


def test_the_checks_catch_a_write_and_a_second_line(arena: Arena) -> None:
    before = arena.snapshot()
    (arena.outside / "etc" / "sentinel.conf").write_text("changed\n")
    with pytest.raises(AssertionError):
        assert_untouched(before, arena.snapshot())
    with pytest.raises(AssertionError):
        assert_refused(Result(2, "", "error(usage): one\nerror(usage): two\n"), 2)


def test_the_sandbox_lets_a_case_write_only_in_its_arena(arena: Arena) -> None:
    """A run that escaped the host root must fail, not write on this machine."""
    escape = Path(f"/var/tmp/gni-sandbox-escape-{os.getpid()}")
    inside = arena.scene.work / "inside"
    for target, allowed in ((inside, True), (escape, False)):
        done = subprocess.run(sandboxed(arena.base, "touch", str(target)),
                              capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode != SANDBOX_FAILED, done.stderr
        assert (done.returncode == 0) is allowed, done.stderr
        assert target.exists() is allowed
