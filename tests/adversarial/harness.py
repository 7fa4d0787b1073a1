"""One arena per case: a node tree, a repository, and sentinels outside the host root.

Every case runs the real CLI in a subprocess (the kernel simulated by FakeKernelHost), then
asserts three things: the exit code, one clear stderr line naming the cause (no traceback,
never an internal error), and, by listing the whole arena before and after, that nothing
was created, changed or deleted outside the paths the case allows.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from e2e import FAKENODE, INSTALL_DIR, Scene, add_version, make_scene, standin_env
from helpers import node_args

VERSION = "535.261.03"
SANDBOX_FAILED = 97
# $1 = the arena (stays writable); the rest is the command. Every other mount is made
# read-only in this namespace; a probe write to / must then fail, else the case stops.
SANDBOX = f"""
arena=$1; shift
mount --bind "$arena" "$arena" || exit {SANDBOX_FAILED}
for m in $(awk '{{print $2}}' /proc/self/mounts | sort -u); do
  case "$m" in /proc|/proc/*|/sys|/sys/*|"$arena"|"$arena"/*) continue;; esac
  mount -o remount,bind,ro "$m" 2>/dev/null
done
if touch /.gni-sandbox-probe 2>/dev/null; then rm -f /.gni-sandbox-probe; exit {SANDBOX_FAILED}; fi
exec "$@"
"""
Entry = tuple[str, int, str]  # kind, permission bits, content digest or link target


def sandboxed(arena_dir: Path, *command: str) -> list[str]:
    """`command` in a private mount namespace where every filesystem but `arena_dir` is
    read-only (SANDBOX); it exits SANDBOX_FAILED if that cannot be set up."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", SANDBOX, "sandbox",
            str(arena_dir), *command]


@dataclass
class Result:
    """What one run of the CLI did."""

    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        """stderr without the JSON log events: what a person reads."""
        return [line for line in self.stderr.splitlines()
                if line.strip() and not line.startswith("{")]

    @property
    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.stderr.splitlines() if line.startswith("{")]


@dataclass
class Arena:
    """A node (host root), its repository, a work dir, and `outside`: data not ours."""

    base: Path
    scene: Scene
    outside: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.scene.root

    @property
    def install_dir(self) -> Path:
        return self.scene.root / INSTALL_DIR

    @property
    def termination_log(self) -> Path:
        return self.scene.work / "termination-log"

    def args(self, *extra: str) -> list[str]:
        return [*node_args(self.root), "--log-format", "json",
                "--termination-log", str(self.termination_log), *extra]

    def run(self, *args: str, env: Mapping[str, str] | None = None,
            timeout: float = 60) -> Result:
        """`fakenode.py ARGS` with this arena's environment (plus `env`), sandboxed: in a
        private mount namespace where every filesystem but the arena is read-only, so a
        regression that escapes the host root fails the case instead of harming this
        machine (a case that links the node's install dir to `/usr/local` once did)."""
        command = sandboxed(self.base, sys.executable, str(FAKENODE), *args)
        done = subprocess.run(command, capture_output=True, text=True, env=self.run_env(env),
                              timeout=timeout, check=False, errors="replace")
        assert done.returncode != SANDBOX_FAILED, f"sandbox not set up: {done.stderr[-500:]}"
        return Result(done.returncode, done.stdout, done.stderr)

    def run_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """This arena's environment plus `env`, with TMPDIR in the work dir (created): what a
        sandboxed run of the CLI gets."""
        tmp = self.scene.work / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return {**self.env, **(env or {}), "TMPDIR": str(tmp)}

    def snapshot(self) -> dict[str, Entry]:
        """Every path in the arena with its kind, mode and content (or link target)."""
        return snapshot(self.base)


def snapshot(top: Path) -> dict[str, Entry]:
    listing: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            rel = str(path.relative_to(top))
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                listing[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                listing[rel] = ("dir", mode, "")
            elif stat.S_ISREG(info.st_mode):
                listing[rel] = ("file", mode, _digest(path))
            else:
                listing[rel] = ("other", mode, str(info.st_rdev))
    return listing


def _digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


_TEMPLATES: dict[str, Path] = {}


def make_arena(base: Path, *, with_package: bool = True) -> Arena:
    """A fresh arena; the node and repository are built once per process and copied."""
    key = "package" if with_package else "bare"
    if key not in _TEMPLATES:
        template = Path(os.environ.get("TMPDIR", "/tmp")) / f"gni-adversarial-{os.getpid()}-{key}"
        shutil.rmtree(template, ignore_errors=True)
        template.mkdir(parents=True)
        scene = make_scene(template)
        if with_package:
            add_version(scene, VERSION)
        shutil.rmtree(scene.work / f"{VERSION}-proprietary-0-False", ignore_errors=True)
        _TEMPLATES[key] = template
    shutil.copytree(_TEMPLATES[key], base, symlinks=True, dirs_exist_ok=True)
    scene = Scene(base / "node", base / "repo", base / "work")
    scene.work.mkdir(exist_ok=True)
    outside = base / "outside"
    (outside / "etc").mkdir(parents=True)
    (outside / "etc" / "sentinel.conf").write_text("not the installer's\n")
    (outside / "bin").mkdir()
    (outside / "bin" / "kubelet").write_text("#!/bin/sh\n")
    env = {key: value for key, value in standin_env(VERSION).items()
           if not _installer_setting(key)}
    return Arena(base, scene, outside, env)


def _installer_setting(name: str) -> bool:
    """Variables of the machine running the tests must not steer the case."""
    from installer.config import SETTINGS

    return name in {s.envvar for s in SETTINGS if s.envvar}


def assert_refused(result: Result, code: int, *causes: str) -> None:
    """The exit code, one line naming the cause (every `causes` text in it), no traceback."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "error(internal)" not in result.stderr, result.stderr[-3000:]
    assert result.code == code, f"exit {result.code}, wanted {code}:\n{result.stderr[-3000:]}"
    assert len(result.lines) == 1, result.lines
    line = result.lines[0]
    for cause in causes:
        assert cause in line, f"{cause!r} not in {line!r}"


def assert_untouched(before: Mapping[str, Entry], after: Mapping[str, Entry],
                     allowed: Iterable[str] = ()) -> None:
    """Nothing created, changed or deleted in the arena except under `allowed` prefixes
    (relative to the arena; the termination log and the work dir are always allowed)."""
    prefixes = (*allowed, "work/")
    changed = {path for path in before.keys() | after.keys()
               if before.get(path) != after.get(path)
               and not any(path == p.rstrip("/") or path.startswith(p) for p in prefixes)}
    assert not changed, {p: (before.get(p), after.get(p)) for p in sorted(changed)}


# The installer's own work area on the node: what a refused run may leave (the lock file,
# the record of how the run ended that the agent's metrics read, and the cache's per-run temp
# area, emptied when the run ends).
WORK_AREA = (f"node/{INSTALL_DIR}/.lock", f"node/{INSTALL_DIR}/.last-install.json",
             f"node/{INSTALL_DIR}/.cache/tmp")


def refused_untouched(arena: Arena, run: Callable[[], Result], code: int, *causes: str,
                      allowed: Iterable[str] = WORK_AREA) -> Result:
    """`run()` is refused (`assert_refused`: the code, one line naming every cause) and
    changes nothing in the arena outside `allowed` (`assert_untouched`); returns its result
    for the checks a case adds."""
    before = arena.snapshot()
    done = run()
    assert_refused(done, code, *causes)
    assert_untouched(before, arena.snapshot(), allowed)
    return done


def assert_no_trace(result: Result, *secrets: str, paths: Iterable[Path] = ()) -> None:
    """None of `secrets` appears in stdout, stderr (logs) or the given files."""
    for secret in secrets:
        assert secret not in result.stdout and secret not in result.stderr, secret
        for path in paths:
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), (secret, path)


def settle(arena: Arena) -> None:
    """Before a snapshot: the install dir and its cache exist (as after any earlier run) and
    the simulated kernel has written its own state under proc/, so what a refused run
    changes afterwards is the installer's doing alone."""
    (arena.install_dir / ".cache").mkdir(parents=True, exist_ok=True)
    done = arena.run("detect", *arena.args())
    assert done.code == 0, done.stderr[-2000:]


KERNEL_STATE = "node/proc/"  # the simulated kernel's own bookkeeping (FakeKernelHost)


def install(arena: Arena, *extra: str) -> Result:
    """`install` of VERSION from the arena's repository over file://."""
    repo = f"file://{arena.scene.repo}"
    return arena.run("install", *arena.args("--mirror", repo, "--driver-version", VERSION,
                                            *extra))


def install_preloaded(arena: Arena, preloaded: Path, *extra: str) -> Result:
    """`install` of VERSION from a preloaded dir (beside the node, as an image holds one)."""
    return arena.run("install", *arena.args("--preloaded-dir", str(preloaded),
                                            "--driver-version", VERSION, *extra))


def assert_ok(result: Result) -> None:
    """A run that had to succeed did, without a traceback."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.code == 0, result.stderr[-3000:]


def ok_on_node(arena: Arena, run: Callable[[], Result]) -> Result:
    """`run()` succeeds (`assert_ok`) and changes nothing in the arena outside the node
    (`assert_untouched`); returns its result for the checks a case adds."""
    before = arena.snapshot()
    done = run()
    assert_ok(done)
    assert_untouched(before, arena.snapshot(), ("node/",))
    return done


def run_wrapped(arena: Arena, wrapper: str, wrapper_args: list[str], *args: str,
                env: dict[str, str] | None = None) -> Result:
    """`fakenode.py ARGS` in the arena's sandbox, through one more shell `wrapper` that
    mounts what the case needs (a small tmpfs, a private /dev); it exits 96 if it cannot."""
    command = sandboxed(arena.base, "sh", "-c", wrapper, "wrapper", *wrapper_args,
                        sys.executable, str(FAKENODE), *args)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False,
                          env=arena.run_env(env), errors="replace")
    assert done.returncode not in (SANDBOX_FAILED, 96), done.stderr[-2000:]
    return Result(done.returncode, done.stdout, done.stderr)
