"""Kill storms: SIGKILL a real CLI run at random instants, then check nothing is half-written.

One storm starts the same kind of run again and again, kills its whole process group (as the
kubelet kills a container: the installer and any make/gcc it started) at an instant drawn
uniformly over a measured run's duration, notes where the run was (its last JSON log event),
and checks the invariants on disk before the next start. After the storm one run is left to
finish; it must succeed and leave the same invariants, with no temp leftovers.

The checks read the disk the way the installer's readers would: every cache blob hashes to its
name, every cache ref's package is whole, `index.json` parses and every package it lists
verifies against its manifest digest, every package directory in the repository is whole,
and `lib64`/`bin` of the install dir lead into one complete version directory.

Used by tests/host/test_killstorm.py (a storm of KILLSTORM_KILLS per path) and
benchmarks/killstorm.py (the >= 100-kill storms, counts printed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from installer.packages.cache import ref_from_bytes
from installer.packages.documents import DocumentError
from installer.packages.manifest import MANIFEST_NAME, ManifestError, parse_manifest
from installer.packages.repository import INDEX_NAME, parse_index

FAKENODE = Path(__file__).resolve().parent / "fakenode.py"


@dataclass
class StormResult:
    """What one storm did: kills, where they landed, corrupt states seen, the final run."""

    name: str
    typical_s: float
    kills: int = 0
    landed: Counter[str] = field(default_factory=Counter)
    quarters: Counter[int] = field(default_factory=Counter)  # instant / typical, in quarters
    # kills: SIGKILLs that found the run alive; finished_before_kill: runs that ended first
    corrupt: list[str] = field(default_factory=list)
    finished_before_kill: int = 0
    final_code: int | None = None
    final_problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        where = ", ".join(f"{phase} {count}" for phase, count in self.landed.most_common())
        spread = " ".join(str(self.quarters[q]) for q in range(4))
        return (f"{self.name}: {self.kills} kills of a live run, instants over a "
                f"{self.typical_s:.2f} s run ({self.finished_before_kill} more runs finished "
                f"first); corrupt states "
                f"{len(self.corrupt)}; next run exit {self.final_code}, problems "
                f"{len(self.final_problems)}\n  instants by quarter of the run: {spread}"
                f"\n  landed in: {where}")


@dataclass(frozen=True)
class Storm:
    """A kind of run: its argv and env for kill number `i`, the disk checks (`final`: after
    the runs left to finish, stricter: no temp left), the runs left to finish (`finals`;
    none: argv of the next number), where a killed run was (`phase`)."""

    name: str
    argv: Callable[[int], list[str]]
    env: dict[str, str]
    check: Callable[[], list[str]]
    final: Callable[[], list[str]]
    prepare: Callable[[int], None] = lambda _i: None
    phase: Callable[[Path], str] = lambda log: last_event(log) or "start-up"
    finals: tuple[list[str], ...] = ()


def cli(*args: str) -> list[str]:
    """The installer CLI over the simulated kernel (tests/fakenode.py)."""
    return [sys.executable, str(FAKENODE), *args]


def timed_run(argv: list[str], env: dict[str, str], timeout: float = 600
              ) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    return time.monotonic() - start, done


def last_event(log: Path) -> str | None:
    """The last JSON log event the run wrote (a line cut by the kill is skipped)."""
    event = None
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = str(json.loads(line).get("event")) if line.startswith("{") else event
    return event


def kill_at(argv: list[str], env: dict[str, str], delay: float, log: Path
            ) -> int | None:
    """Start the run in its own process group, SIGKILL the group after `delay` seconds;
    returns the exit code when the run finished first, else None."""
    with log.open("w") as stderr:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    try:
        code = proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        code = None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children (make, gcc, tar) die with it
    proc.wait()
    return code


def run_storm(storm: Storm, kills: int, typical_s: float, rng: random.Random,
              work: Path) -> StormResult:
    """SIGKILLs at instants uniform over [0, typical_s] until `kills` of them found the run
    alive (a run that finished first is counted apart; at most 3 * kills starts), checks
    after each, then the runs left to finish and the final checks."""
    result = StormResult(storm.name, typical_s)
    log = work / f"{storm.name}.log"
    for start in range(3 * kills):
        if result.kills >= kills:
            break
        storm.prepare(start)
        instant = rng.uniform(0.0, typical_s)
        code = kill_at(storm.argv(start), storm.env, instant, log)
        result.quarters[min(3, int(4 * instant / typical_s))] += 1
        if code is not None:
            result.finished_before_kill += 1
            result.landed[f"finished first (exit {code})"] += 1
        else:
            result.kills += 1
            result.landed[storm.phase(log)] += 1
        result.corrupt += [f"start {start}: {problem}" for problem in storm.check()]
    storm.prepare(kills)
    for argv in storm.finals or (storm.argv(kills),):
        _, done = timed_run(argv, storm.env)
        result.final_code = result.final_code or done.returncode
        if done.returncode != 0:
            result.final_problems.append(done.stderr[-2000:])
    result.final_problems += storm.final()
    return result


def typical_duration(storm: Storm, runs: int = 2, *, margin: float = 1.25) -> float:
    """The longest of `runs` whole runs from the state the storm starts each run in, after
    one run not timed (it compiles bytecode and fills the page cache), times `margin`: on a
    shared machine a storm's runs may take longer than the timed ones, and their ends must
    be hit too (a run that finishes first does not count as a kill)."""
    times = []
    for i in range(runs + 1):
        storm.prepare(1)  # not a multiple of WARM_EVERY: the cold path
        took, done = timed_run(storm.argv(i), storm.env)
        assert done.returncode == 0, done.stderr[-3000:]
        times.append(took)
    assert storm.check() == []
    return margin * max(times[1:])


# ------------------------------------------------------------------ checks


def sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def check_cache(root: Path, *, quiescent: bool = False) -> list[str]:
    """Every blob hashes to its name; every ref names a whole package; no foreign files.

    `quiescent` (after a run that finished): no run folder is left in `tmp/` either.
    """
    problems: list[str] = []
    blobs = root / "blobs" / "sha256"
    for blob in sorted(blobs.glob("*/*")):
        if blob.is_symlink() or not blob.is_file():
            problems.append(f"cache: {blob} is not a plain file")
        elif sha256_of(blob) != blob.name:
            problems.append(f"cache: blob {blob.name[:12]} does not hash to its name")
    refs = root / "refs"
    for path in sorted(refs.iterdir() if refs.is_dir() else ()):
        if path.suffix != ".json":
            problems.append(f"cache: stray {path.name} in refs/")
            continue
        problems += _check_ref(root, path)
    if quiescent and (root / "tmp").is_dir():
        left = sorted(p.name for p in (root / "tmp").iterdir())
        if left:
            problems.append(f"cache: tmp/ still holds {left[:4]} after a finished run")
    return problems


def _check_ref(root: Path, path: Path) -> list[str]:
    try:
        ref = ref_from_bytes(path.read_bytes(), path)
    except (DocumentError, OSError) as exc:
        return [f"cache: ref {path.name} unreadable: {exc}"]
    blob = root / "blobs" / "sha256" / ref.digest[:2] / ref.digest
    if not blob.is_file():
        return [f"cache: ref {path.name[:12]} names a manifest that is not stored"]
    try:
        manifest = parse_manifest(blob.read_bytes())
    except ManifestError as exc:
        return [f"cache: ref {path.name[:12]}: manifest does not parse: {exc}"]
    missing = [e.path for e in manifest.files
               if not (root / "blobs" / "sha256" / e.sha256[:2] / e.sha256).is_file()]
    return [f"cache: ref {path.name[:12]} lacks blobs for {missing[:3]}"] if missing else []


def check_package(directory: Path, digest: str | None = None) -> list[str]:
    """A package directory is whole: its manifest (of `digest`, when given) and every file."""
    try:
        data = (directory / MANIFEST_NAME).read_bytes()
        manifest = parse_manifest(data)
    except (OSError, ManifestError) as exc:
        return [f"package {directory.name}: manifest unreadable: {exc}"]
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        return [f"package {directory}: manifest is not the one index.json names"]
    for entry in manifest.files:
        path = directory / entry.path
        if not path.is_file() or path.stat().st_size != entry.size or sha256_of(path) \
                != entry.sha256:
            return [f"package {directory}: {entry.path} is missing or differs"]
    return []


def check_repo(repo: Path, *, quiescent: bool = False) -> list[str]:
    """index.json parses and lists only packages that verify; every package dir is whole.

    `quiescent`: no temp file or directory (`.name.*`) is left beside any package or index.
    """
    problems: list[str] = []
    digests: dict[Path, str | None] = {
        m.parent: None for m in repo.glob("*/*/*/" + MANIFEST_NAME)
        if not m.parent.name.startswith(".")}
    index = repo / INDEX_NAME
    if index.exists():
        try:
            parsed = parse_index(index.read_bytes(), str(repo))
        except ManifestError as exc:
            return [f"repo: index.json does not parse: {exc}"]
        digests.update({repo / c.path: c.manifest_sha256 for c in parsed.packages})
    for directory, digest in sorted(digests.items()):
        problems += check_package(directory, digest)
    if quiescent:
        left = [str(p.relative_to(repo)) for p in repo.rglob(".*")
                if not p.name.endswith(".lock")]
        if left:
            problems.append(f"repo: temp leftovers {sorted(left)[:4]}")
    return problems


def version_of(version_dir: Path) -> str:
    """A version directory is whole: metadata written last, and the SONAME links resolve."""
    meta = json.loads((version_dir / ".staged.json").read_text())
    assert (version_dir / "lib64" / "libnvidia-ml.so.1").is_file()
    assert (version_dir / "lib64" / "libcuda.so.1").is_file()
    assert meta["digest"] and version_dir.name.startswith(meta["driver_version"])
    return str(meta["driver_version"])


def check_consistent(install_dir: Path, *, quiescent: bool = True) -> str | None:
    """The version `lib64` and `bin` lead into, asserting it is complete; None before any.

    While a run is switching, two separate lookups may straddle the one atomic rename of
    `.current`, so only a quiescent check (no run alive) requires both to agree.
    """
    lib64, bindir = install_dir / "lib64", install_dir / "bin"
    if not lib64.is_symlink():
        return None
    version = version_of(lib64.resolve().parent)
    other = version_of(bindir.resolve().parent)
    if quiescent:
        assert other == version, "lib64 and bin point at different versions"
    return version


def check_install(install_dir: Path) -> list[str]:
    """`check_consistent` as a list of problems (for a storm's tally)."""
    try:
        check_consistent(install_dir)
    except (AssertionError, OSError, ValueError) as exc:
        return [f"install dir: {exc!r}"]
    return []
