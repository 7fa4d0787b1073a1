"""The CDI spec's paths on the node when they are not what they should be: the spec dir
(`CDI_SPEC_DIR`) a file, under a file, or a link to a file is exit 2 naming the setting and
the file, before anything is written (`install`, `signal`, `rollback`); the CDI record
`.cdi.json` a directory is exit 11 naming it; a directory in the place of our spec file is
someone else's (left alone, no spec written, a warning); a spec dir linked outside the host
root lands inside it; CDI=off needs no spec dir at all.

Each case runs the real CLI sandboxed in an arena and asserts the exit code, the one line
and, by listing the arena before and after, that nothing was written outside the node's
work area.
"""

from __future__ import annotations

import json

import pytest

from adversarial.harness import (
    KERNEL_STATE,
    VERSION,
    Arena,
    Result,
    assert_ok,
    assert_refused,
    assert_untouched,
    settle,
)

SPEC = "gpu-node-installer-nvidia.json"
SPEC_DIR = "var/run/cdi"


def _spec_dir_file(arena: Arena) -> None:
    (arena.root / SPEC_DIR).parent.mkdir(parents=True, exist_ok=True)
    (arena.root / SPEC_DIR).write_text("a file, not the runtimes' CDI directory\n")


def _parent_file(arena: Arena) -> None:
    (arena.root / "var/run").mkdir(parents=True, exist_ok=True)
    (arena.root / "var/run/cdi").write_text("a file where a directory would be\n")


def _link_to_file(arena: Arena) -> None:
    (arena.root / "etc/cdi-file").write_text("not a directory\n")
    (arena.root / "var/run").mkdir(parents=True, exist_ok=True)
    (arena.root / SPEC_DIR).symlink_to("/etc/cdi-file")


# (prepare the node, CDI_SPEC_DIR, what the line says)
SPEC_DIRS = {
    "the spec dir is a file": (_spec_dir_file, "/var/run/cdi",
                               "--cdi-spec-dir /var/run/cdi is a file, not a directory"),
    "a directory above it is a file": (
        _parent_file, "/var/run/cdi/nvidia",
        "--cdi-spec-dir /var/run/cdi/nvidia cannot be created: /var/run/cdi is a file"),
    "a link to a file": (_link_to_file, "/var/run/cdi",
                         "--cdi-spec-dir /var/run/cdi leads to /etc/cdi-file, a file"),
}


REFUSED = 5  # seconds a refused run may take; a whole install (the setting-up runs) more
INSTALL = 20


def _install(arena: Arena, *extra: str, timeout: float = REFUSED) -> Result:
    repo = f"file://{arena.scene.repo}"
    return arena.run("install", *arena.args("--mirror", repo, "--driver-version", VERSION,
                                            *extra), timeout=timeout)


def _run(arena: Arena, command: str, spec_dir: str) -> Result:
    if command == "install":
        return _install(arena, "--cdi-spec-dir", spec_dir)
    return arena.run(*command.split(), *arena.args("--cdi-spec-dir", spec_dir),
                     timeout=REFUSED)


@pytest.mark.parametrize("case", SPEC_DIRS)
def test_a_spec_dir_that_is_a_file_is_refused_before_install(arena: Arena, case: str) -> None:
    prepare, spec_dir, said = SPEC_DIRS[case]
    prepare(arena)
    settle(arena)
    before = arena.snapshot()
    done = _run(arena, "install", spec_dir)
    assert_refused(done, 2, "error(config): ", said, "fix: remove or rename that file, or "
                   "point --cdi-spec-dir at a directory")
    assert_untouched(before, arena.snapshot(), (KERNEL_STATE,))


@pytest.mark.parametrize("command", ["signal", "stage --rollback"])
def test_signal_and_rollback_refuse_it_too(arena: Arena, command: str) -> None:
    """After a good install, the commands that rewrite the spec refuse the file first."""
    assert_ok(_install(arena, timeout=INSTALL))
    (arena.root / SPEC_DIR / SPEC).unlink()
    (arena.root / SPEC_DIR).rmdir()
    _spec_dir_file(arena)
    before = arena.snapshot()
    done = _run(arena, command, "/var/run/cdi")
    assert_refused(done, 2, "--cdi-spec-dir /var/run/cdi is a file, not a directory")
    assert_untouched(before, arena.snapshot(), (KERNEL_STATE,))


def test_a_record_that_is_a_directory_is_refused(arena: Arena) -> None:
    settle(arena)
    (arena.install_dir / ".cdi.json").mkdir()
    before = arena.snapshot()
    done = _install(arena)
    assert_refused(done, 11, f"{arena.install_dir / '.cdi.json'} is not a regular file",
                   "fix: remove .cdi.json from the install dir")
    assert_untouched(before, arena.snapshot(), (KERNEL_STATE,))


def test_a_directory_in_place_of_our_spec_is_left_alone(arena: Arena) -> None:
    """Someone's directory at our file's name: no spec, a warning, the directory as it was;
    the install itself succeeds (a node without a CDI spec still serves GPUs)."""
    theirs = arena.root / SPEC_DIR / SPEC
    theirs.mkdir(parents=True)
    (theirs / "keep").write_text("someone else's\n")
    settle(arena)
    before = arena.snapshot()
    done = _install(arena, timeout=INSTALL)
    assert_ok(done)
    assert any(f"/{SPEC_DIR}/{SPEC} exists and was not written by gpu-node-installer" in
               str(e.get("detail")) for e in done.events), done.stderr[-2000:]
    after = arena.snapshot()
    assert {p: after[p] for p in after if p.startswith(f"node/{SPEC_DIR}")} == \
        {p: before[p] for p in before if p.startswith(f"node/{SPEC_DIR}")}


def test_a_spec_dir_linked_outside_the_host_root_stays_inside(arena: Arena) -> None:
    """`/var/run/cdi -> <the arena's outside dir>`, an absolute link: followed under the
    host root, as the node would, so the spec lands inside the node tree."""
    (arena.root / "var/run").mkdir(parents=True, exist_ok=True)
    (arena.root / SPEC_DIR).symlink_to(arena.outside / "cdi")
    settle(arena)
    before = arena.snapshot()
    assert_ok(_install(arena, timeout=INSTALL))
    inside = arena.root / str(arena.outside / "cdi").lstrip("/") / SPEC
    assert json.loads(inside.read_text())["kind"] == "nvidia.com/gpu"
    assert not (arena.outside / "cdi").exists()
    assert_untouched(before, arena.snapshot(), ("node/",))  # outside/ and the repo as they were


def test_cdi_off_needs_no_spec_dir(arena: Arena) -> None:
    _spec_dir_file(arena)
    settle(arena)
    done = _install(arena, "--cdi", "off", timeout=INSTALL)
    assert_ok(done)
    assert (arena.root / SPEC_DIR).read_text() == "a file, not the runtimes' CDI directory\n"
