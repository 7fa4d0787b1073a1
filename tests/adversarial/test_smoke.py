"""The harness itself: a good install passes, and the checks catch what they must."""

from __future__ import annotations

import pytest

from adversarial.harness import VERSION, Arena, Result, assert_refused, assert_untouched


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
