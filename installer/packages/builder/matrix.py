"""`package build` for many kernels and both flavours in one command, into one repository.

`--kernel-headers` of several releases are grouped by release (`headers.group_headers`);
`--flavour both` builds `open` and `proprietary`, each from the `--nvidia-source` that has
that module tree (a `.run` has both; Debian splits them into `nvidia-kernel-source` and
`nvidia-open-kernel-source`), with the `--patch`es that apply to that tree. Every
(release, flavour) is one single-kernel `build()`.

Concurrency rule: at most `--jobs` compile jobs at once overall. `min(builds, jobs)` builds
run side by side, and their makes share one GNU make jobserver of `--jobs` slots (a
finished build's slot goes to the ones still compiling, so no core idles at the tail). A build that
fails is reported with its release and first compiler error; the others are still
published: each finished package updates `index.json` at once, under the repository's
lock (`publish.update_index`), so a good kernel is never lost to a bad one. Every refusal
that concerns the whole command (out-dir, mixed versions, a missing flavour) comes first,
before anything is compiled or written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import InstallerError
from installer.packages.builder import BuildRequest, BuildResult, build, check_request
from installer.packages.builder.compile import patch_applies
from installer.packages.builder.headers import group_headers
from installer.packages.builder.inputs import PackageBuildError
from installer.packages.builder.nvsource import unpack_source

BOTH = "both"
_FLAVOURS = ("open", "proprietary")
_MAX_TOKENS = 4096  # well under a pipe's 64 KiB, so writing the tokens never blocks
Task = tuple[str, str]  # (kernel release, flavour)


@dataclass(frozen=True)
class Failure:
    """One (release, flavour) that did not build, and why (its one-line error)."""

    release: str
    flavour: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"kernel_release": self.release, "flavour": self.flavour, "error": self.error}


@dataclass(frozen=True)
class MatrixResult:
    """Every package built and every failure, and how the builds shared the cores."""

    built: tuple[BuildResult, ...]
    failures: tuple[Failure, ...]
    concurrent: int
    jobs: int
    seconds: float
    index: Path | None
    shard: tuple[int, int] | None = None  # (index, count) of `--shard`

    def to_dict(self) -> dict[str, Any]:
        return {"packages": [r.to_dict() for r in self.built],
                **({"shard": list(self.shard)} if self.shard else {}),
                "failures": [f.to_dict() for f in self.failures],
                "index": str(self.index) if self.index else None,
                "concurrent_builds": self.concurrent, "jobs": self.jobs,
                "seconds": round(self.seconds, 1)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        total = len(self.built) + len(self.failures)
        if self.shard and not total:
            return (f"shard {self.shard[0]}/{self.shard[1]}: nothing to do (the matrix has "
                    "fewer tasks than shards)")
        lines = [f"built {len(self.built)} of {total} packages in {self.seconds:.0f} s "
                 f"({self.concurrent} at a time, sharing {self.jobs} make jobs)"]
        for result in self.built:
            m = result.manifest
            lines.append(f"ok     {m.kernel_release} {m.driver_version} {m.flavour}: "
                         f"{result.directory} sha256:{result.digest[:12]}")
        lines += [f"FAILED {f.release} {f.flavour}: {f.error}" for f in self.failures]
        if self.index:
            lines.append(f"index {self.index}")
        return "\n".join(lines)

    def error(self) -> PackageBuildError | None:
        """The command's failure (exit 2) when any build failed, naming each one."""
        if not self.failures:
            return None
        total = len(self.built) + len(self.failures)
        return PackageBuildError(
            f"{len(self.failures)} of {total} builds failed: "
            + "; ".join(f"{f.release} {f.flavour}: {f.error}" for f in self.failures),
            remedy="fix those kernels' inputs (or --patch the sources) and build them again; "
                   "the others are published")


def build_packages(request: BuildRequest, sources: tuple[Path, ...]
                   ) -> BuildResult | MatrixResult:
    """One package (the single-kernel path, unchanged), or the matrix when asked for more."""
    groups = group_headers(request.kernel_headers) if request.kernel_headers else {}
    if len(sources) <= 1 and request.flavour != BOTH and len(groups) <= 1:
        return build(dataclasses.replace(request, nvidia_source=sources[0] if sources else None))
    return build_matrix(request, sources, groups)


def build_matrix(request: BuildRequest, sources: tuple[Path, ...],
                 groups: dict[str, tuple[Path, ...]],
                 select: Callable[[list[Task]], list[Task]] | None = None) -> MatrixResult:
    """Check the whole command, then build every (release, flavour), `--jobs` at a time
    (or only those `select` keeps of the sorted matrix: a `--shard`'s part)."""
    if not sources or not groups:
        raise PackageBuildError("several kernels or --flavour both compile modules: give "
                                "--nvidia-source and --kernel-headers")
    by_flavour = _pick_sources(sources, request.flavour, request.patches)
    tasks = [(release, flavour) for release in sorted(groups) for flavour in by_flavour]
    what = f"{len(tasks)} packages ({', '.join(f'{r} {f}' for r, f in tasks)})"
    if request.output is not None:
        raise PackageBuildError(f"--out-dir holds one package but this builds {what}",
                                remedy="write them into a repository: --repo DIR")
    if request.tarball is not None:
        raise PackageBuildError(f"--tarball holds one package but this builds {what}",
                                remedy="drop --tarball (the repository holds every package)")
    if request.kernel_release is not None and len(groups) > 1:
        raise PackageBuildError(f"--kernel-release {request.kernel_release} cannot name "
                                f"{len(groups)} kernels", remedy="drop --kernel-release")
    first = tasks[0]
    if select is not None and not (tasks := select(tasks)):
        return MatrixResult((), (), 0, 0, 0.0, None)
    check_request(dataclasses.replace(request, nvidia_source=by_flavour[first[1]][0],
                                      kernel_headers=groups[first[0]], flavour=first[1]))
    jobs = request.jobs or os.cpu_count() or 1
    concurrent = max(1, min(len(tasks), jobs))
    started = time.monotonic()

    def one(task: tuple[str, str], jobserver: tuple[int, int]) -> BuildResult | Failure:
        release, flavour = task
        source, patches = by_flavour[flavour]
        try:
            return build(dataclasses.replace(
                request, nvidia_source=source, kernel_headers=groups[release],
                flavour=flavour if request.flavour else None,  # None: as one build does
                patches=patches, jobs=None, jobserver=jobserver))
        except InstallerError as exc:
            return Failure(release, flavour, exc.message)
        except Exception as exc:  # a bug in one build must not lose the others' packages
            return Failure(release, flavour, f"{type(exc).__name__}: {exc}")

    outcomes = _run_shared(tasks, concurrent, jobs, one)
    built = tuple(o for o in outcomes if isinstance(o, BuildResult))
    failures = tuple(o for o in outcomes if isinstance(o, Failure))
    index = next((r.index for r in built if r.index), None)
    return MatrixResult(built, failures, concurrent, jobs, time.monotonic() - started, index)


def _run_shared(tasks: list[tuple[str, str]], concurrent: int, jobs: int,
                one: Callable[[tuple[str, str], tuple[int, int]], BuildResult | Failure]
                ) -> list[BuildResult | Failure]:
    """Run the tasks on `concurrent` threads whose makes share one GNU make jobserver.

    Each make holds one implicit job and takes more from the pipe's tokens: `jobs -
    concurrent` at the start, and a worker with nothing left to build adds its own, so
    at every moment at most `jobs` compile jobs run and none is left idle at the tail.
    """
    pending: queue.SimpleQueue[int] = queue.SimpleQueue()
    for number in range(len(tasks)):
        pending.put(number)
    outcomes: list[BuildResult | Failure | None] = [None] * len(tasks)
    read, write = os.pipe()
    os.write(write, b"+" * min(jobs - concurrent, _MAX_TOKENS))

    def worker() -> None:
        while True:
            try:
                number = pending.get_nowait()
            except queue.Empty:
                os.write(write, b"+")  # this worker's job slot goes to the others' makes
                return
            outcomes[number] = one(tasks[number], (read, write))

    threads = [threading.Thread(target=worker, name=f"gni-build-{n}")
               for n in range(concurrent)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        os.close(read)
        os.close(write)
    return [o for o in outcomes if o is not None]


def _pick_sources(sources: tuple[Path, ...], flavour: str | None, patches: tuple[Path, ...]
                  ) -> dict[str, tuple[Path, tuple[Path, ...]]]:
    """Per flavour to build, the first source that has its module tree (one version), and
    the patches for that tree: those that apply to it cleanly (`open` and `proprietary`
    trees differ: a fix for one may have nothing to patch in the other). A patch that
    applies to no tree is refused."""
    found: dict[str, Path] = {}
    versions: dict[str, str] = {}
    fits: dict[str, tuple[Path, ...]] = {}
    with tempfile.TemporaryDirectory(prefix="gni-probe-") as work:
        for number, path in enumerate(sources):
            source = unpack_source(path, Path(work) / str(number))
            versions[path.name] = source.version
            for name, tree in source.trees.items():
                if name not in found:
                    found[name] = path
                    fits[name] = tuple(p for p in patches if patch_applies(p, tree))
    if len(set(versions.values())) > 1:
        raise PackageBuildError(
            "the --nvidia-source are of different driver versions ("
            + ", ".join(f"{name} is {version}" for name, version in versions.items()) + ")",
            remedy="give sources of one driver version (e.g. nvidia-kernel-source and "
                   "nvidia-open-kernel-source of the same version)")
    wanted = list(_FLAVOURS) if flavour == BOTH else [flavour] if flavour else sorted(found)
    if flavour is None and len(wanted) > 1:
        raise PackageBuildError("the --nvidia-source have both open and proprietary modules",
                                remedy="pass --flavour open, proprietary or both")
    missing = [name for name in wanted if name not in found]
    if missing:
        raise PackageBuildError(
            f"--flavour {flavour} needs {' and '.join(missing)} module sources, but the "
            f"--nvidia-source have only {', '.join(sorted(found))} modules",
            remedy="add nvidia-open-kernel-source (Debian contrib) for open, "
                   "nvidia-kernel-source (non-free) for proprietary, or NVIDIA's .run "
                   "(it has both)")
    unused = [p.name for p in patches if not any(p in fits[name] for name in wanted)]
    if unused:
        raise PackageBuildError(f"patch {unused[0]} applies to none of the "
                                f"{' or '.join(wanted)} module sources",
                                remedy="make the patch -p1 relative to the module tree "
                                       "(where Kbuild is) of these sources")
    return {name: (found[name], fits[name]) for name in wanted}
