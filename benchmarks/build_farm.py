"""Benchmark: N `package build --shard i/N` one after another against one `--repo` build.

    .venv/bin/python benchmarks/build_farm.py [--shards 3] [--jobs 2] [--fleet 100] [--quick]

The matrix is 3 real bookworm kernels (6.1.0-57, -56, -55: the real-kernel tier's cached
headers .debs) x both flavours of tests/buildfarm.run_tree's stand-in sources. In one run:
  single  one `package build --repo` of the whole matrix
  shards  each of the N shards alone (the machine to itself, as one pod per node would
          have), then `package index`
and checks the farm's two promises: balance (the slowest shard within 25% of the shards'
total / N) and no overhead (the shards' sum within 10% of the single build), so N machines
give close to N times. The repositories must be byte-identical. The closing line projects
a fleet of `--fleet` builds from the measured per-build cost: on one machine, and on N.
`--quick` (the test suite runs it): the same matrix, shards and checks over the host tier's
stand-in build trees (tests/nvsources.fake_kbuild, whose `make modules` runs gcc in about a
second) instead of the real headers .debs (a real compile of 6 builds is minutes); the
repositories must still be byte-identical, the timing promises are reported but not judged.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from buildfarm import matrix_args, package_files, run_tree, timed  # noqa: E402
from nvsources import fake_kbuild  # noqa: E402

from tests.kernel import assets  # noqa: E402

RELEASES = ("6.1.0-57-amd64", "6.1.0-56-amd64", "6.1.0-55-amd64")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--fleet", type=int, default=100, help="builds to project for")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gni-bench-farm-") as tmp:
        work = Path(tmp)
        headers = ([fake_kbuild(work / f"h-{r}", r) for r in RELEASES] if args.quick else
                   [deb for release in RELEASES for deb in assets.release_headers_debs(release)])
        build = matrix_args(run_tree(work), headers, args.jobs)
        tasks = len(RELEASES) * 2
        single = timed(["package", "build", *build, f"--repo={work / 'single'}"])
        shards = [timed(["package", "build", *build, f"--repo={work / 'farm'}",
                         f"--shard={n}/{args.shards}"]) for n in range(args.shards)]
        index = timed(["package", "index", str(work / "farm")])
        same = (package_files(work / "farm") == package_files(work / "single")
                and (work / "farm" / "index.json").read_bytes()
                == (work / "single" / "index.json").read_bytes())
    total = sum(shards)
    per_build = single / tasks
    report = {
        "tasks": tasks, "shards": args.shards, "jobs": args.jobs,
        "single_s": round(single, 1), "shard_s": [round(s, 1) for s in shards],
        "shards_sum_s": round(total, 1), "index_s": round(index, 1),
        "slowest_over_mean": round(max(shards) / (total / args.shards), 3),
        "balanced": max(shards) <= 1.25 * total / args.shards,
        "sum_over_single": round(total / single, 3),
        "no_overhead": abs(total - single) <= 0.10 * single,
        "byte_identical": same,
        "per_build_s": round(per_build, 1),
        "fleet": args.fleet,
        "fleet_one_machine_s": round(args.fleet * per_build),
        "fleet_on_n_machines_s": round(math.ceil(args.fleet / args.shards) * per_build
                                       + index / tasks * args.fleet),
    }
    print(json.dumps(report, indent=1))
    if not same or not (args.quick or (report["balanced"] and report["no_overhead"])):
        sys.exit("the farm's promises did not hold (see above)")


if __name__ == "__main__":
    main()
