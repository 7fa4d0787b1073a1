"""`package build --shard INDEX/COUNT`: one machine's share of a many-kernel build.

A build farm (a Kubernetes Indexed Job, a CI matrix) runs the same command on COUNT
machines; each must pick the same split without talking to the others. The matrix of
(kernel release, flavour) is sorted, and tasks are dealt out longest-first to the least
loaded shard (ties: the lower shard), by the expected seconds of `--shard-costs` where
known (else all equal: a round robin). Same inputs, same split, on every machine.

A shard writes packages only, never `index.json` (the one file every shard would
contend for): each package goes into the repository layout through the usual temp dir
and rename, and then its manifest digest is recorded in a receipt,
`<repo>/.receipts/<kernel>/<driver>/<flavour>.sha256`, written atomically last.
`package index` lists only packages whose receipt matches, so a shard killed at any
instant leaves nothing listed that is not whole; rerunning the shard replaces its part.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from installer.node.documents import read_json_file
from installer.node.host import write_atomic
from installer.packages.builder import BuildRequest, BuildResult
from installer.packages.builder.headers import group_headers
from installer.packages.builder.inputs import PackageBuildError
from installer.packages.builder.matrix import MatrixResult, Task, build_matrix
from installer.packages.index import receipt_path

_SPEC_RE = re.compile(r"^(\d{1,5})/(\d{1,5})$")
_MAX_COSTS_BYTES = 4 * 1024**2


@dataclass(frozen=True)
class Shard:
    """Which share of the matrix this machine builds (0-based, like JOB_COMPLETION_INDEX)."""

    index: int
    count: int
    costs: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def pick(self, tasks: list[Task]) -> list[Task]:
        """This shard's tasks, in matrix order: the same on every machine."""
        shard_of = assign(tasks, self.count, self.costs)
        return [task for task in tasks if shard_of[task] == self.index]


def parse_shard(spec: str | None, count: int | None, job_index: str | None,
                costs_file: Path | None = None) -> Shard | None:
    """`--shard INDEX/COUNT`, or `--shard-count N` with the Job's JOB_COMPLETION_INDEX."""
    if spec is None and count is None:
        return None
    if spec is None:
        if job_index is None or not job_index.isdigit():
            raise PackageBuildError(
                f"--shard-count {count} needs this shard's index, and JOB_COMPLETION_INDEX "
                f"is {job_index!r}", remedy="run it in an Indexed Job, or pass --shard INDEX/COUNT")
        spec = f"{int(job_index)}/{count}"
    match = _SPEC_RE.match(spec)
    if match is None or not int(match[1]) < int(match[2]):
        raise PackageBuildError(f"--shard {spec!r} is not INDEX/COUNT with 0 <= INDEX < COUNT",
                                remedy="e.g. --shard 0/4 ... --shard 3/4")
    if count is not None and int(match[2]) != count:
        raise PackageBuildError(f"--shard {spec} and --shard-count {count} disagree",
                                remedy="give one of them")
    return Shard(int(match[1]), int(match[2]), _costs(costs_file))


def _costs(path: Path | None) -> dict[str, float]:
    """`{"<release> <flavour>": seconds}` from an earlier build (see docs/build-farm.md)."""
    if path is None:
        return {}
    data = read_json_file(path, limit=_MAX_COSTS_BYTES, name=f"--shard-costs {path}",
                          error=PackageBuildError)
    if data is None:
        raise PackageBuildError(f"--shard-costs {path}: no such file")
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            and v >= 0 for k, v in data.items()):
        raise PackageBuildError(f"--shard-costs {path}: must be a JSON object of "
                                '"<release> <flavour>": seconds')
    return {key: float(value) for key, value in data.items()}


def assign(tasks: list[Task], count: int, costs: Mapping[str, float]) -> dict[Task, int]:
    """Each task's shard: longest expected first, to the least loaded (lowest on ties)."""
    known = sorted(costs.values())
    default = known[len(known) // 2] if known else 1.0
    cost = {task: costs.get(f"{task[0]} {task[1]}", default) for task in tasks}
    loads = [0.0] * count
    shard_of: dict[Task, int] = {}
    for _, task in sorted(enumerate(tasks), key=lambda item: (-cost[item[1]], item[0])):
        target = min(range(count), key=lambda s: (loads[s], s))
        loads[target] += cost[task]
        shard_of[task] = target
    return shard_of


def build_shard(request: BuildRequest, sources: tuple[Path, ...], shard: Shard
                ) -> MatrixResult:
    """Build this shard's part of the matrix into `--repo`, packages and receipts only."""
    if request.repo is None:
        raise PackageBuildError("--shard writes into a repository shared by the shards",
                                remedy="pass --repo DIR (the shared volume or bucket dir)")
    if request.aliases:
        raise PackageBuildError("--alias is set by `package index`, which runs once after "
                                "the shards", remedy="pass --alias to `package index`")
    groups = group_headers(request.kernel_headers) if request.kernel_headers else {}
    result = build_matrix(dataclasses.replace(request, index=False, force=True), sources,
                          groups, select=shard.pick)
    for built in result.built:
        write_receipt(request.repo, built)
    return dataclasses.replace(result, shard=(shard.index, shard.count))


def write_receipt(repo: Path, built: BuildResult) -> None:
    """The package's manifest digest, written (atomically) only once it is in place."""
    m = built.manifest
    target = receipt_path(repo, m.kernel_release, m.driver_version, m.flavour)
    write_atomic(target, f"{built.digest}\n".encode())
    os.chmod(target, 0o644)
