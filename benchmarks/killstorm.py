#!/usr/bin/env python3
"""Kill storms over three paths (repo, cos, fallback), at full size (the suite runs smaller ones).

For each path, `--kills` SIGKILLs (default 100) of the run's whole process group at instants
uniform over a measured run, the invariants checked after every kill (no half-written cache
entry, package or index; tests/killstorm.py), then runs left to finish and checked again:
    repo      `package build --repo`: index publishing (three kernels, two contents each)
    cos       `install` assembling from the cos-tools layout
    fallback  `install --build-fallback auto`: modules compiled on the node (~6 s a run)
Prints, per storm, where the kills landed and the corrupt states found; exit 1 if any.

    .venv/bin/python benchmarks/killstorm.py [--kills 100] [--only repo,cos] [--seed 1234]

`--quick` (the test suite runs it): 2 kills per storm, the same scenes and checks; without
`--only`, the repo and cos storms (the on-node build's runs compile for seconds each, and
tests/host/test_killstorm.py already storms that scene in every suite run).
"""

from __future__ import annotations

import argparse
import random
import socketserver
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from killscenes import cos_scene, fallback_available, fallback_scene, repo_scene  # noqa: E402
from killstorm import run_storm, typical_duration  # noqa: E402

SCENES = {"repo": repo_scene, "cos": cos_scene, "fallback": fallback_scene}
# a killed run drops its download mid-response: the test server would print each as a trace
socketserver.BaseServer.handle_error = lambda *_: None  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--only", default=None, help=f"default: {','.join(SCENES)}")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    opts = parser.parse_args()
    if opts.quick:
        opts.kills = 2
    if opts.only is None:
        opts.only = "repo,cos" if opts.quick else ",".join(SCENES)
        if opts.quick:
            print("fallback: not run with --quick (tests/host/test_killstorm.py storms it)")
    corrupt = 0
    for name in opts.only.split(","):
        if name == "fallback" and fallback_available() is not None:
            print(f"fallback: not run: {fallback_available()}")
            corrupt += 1  # a storm that did not run proves nothing: fail
            continue
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"gni-killstorm-{name}-") as tmp:
            (Path(tmp) / "scene").mkdir()
            with SCENES[name](Path(tmp) / "scene") as storm:
                result = run_storm(storm, opts.kills, typical_duration(storm),
                                   random.Random(opts.seed), Path(tmp))
        print(result.summary())
        print(f"  wall {time.monotonic() - started:.0f} s")
        for problem in result.corrupt[:10] + result.final_problems[:3]:
            print(f"  ! {problem}")
        corrupt += len(result.corrupt) + len(result.final_problems) + (result.final_code != 0)
    print(f"corrupt states in all: {corrupt}")
    return 1 if corrupt else 0


if __name__ == "__main__":
    sys.exit(main())
