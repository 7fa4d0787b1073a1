"""Benchmark: staging NVIDIA's real 535 user-mode files (hard links vs copies), the switch
alone, SONAME reading, and verify over the stand-ins.

    .venv/bin/python benchmarks/bench_stage.py [--reps N] [--quick]

Uses the cached Debian extraction from tests/artifacts.py (downloaded on first use).
`--quick` (the test suite runs it): one repetition of each, the same real files.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import artifacts  # noqa: E402
from native import build_standins  # noqa: E402
from native.contexts import make_ctx  # noqa: E402
from native.packages import standin_tree, tree_package  # noqa: E402

from installer.installdir import versions as installed  # noqa: E402
from installer.node.elf import read_soname  # noqa: E402
from installer.stages import stage  # noqa: E402
from installer.stages.verify import verify  # noqa: E402
from installer.testing import SAMPLE_NODES, build_node  # noqa: E402


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def report(name: str, times: list[float], extra: str = "") -> None:
    print(f"{name:<44} median {statistics.median(times):8.1f} ms  "
          f"min {min(times):8.1f} ms  n={len(times)} {extra}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    opts = parser.parse_args()
    reps = 1 if opts.quick else opts.reps
    versions = ("535.261.03", "535.309.01")
    packages = {v: tree_package(artifacts.nvidia_tree(v), v) for v in versions}
    size_mb = packages[versions[0]].manifest.total_size / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        root = build_node(Path(tmp) / "node", SAMPLE_NODES["debian12-l4"])
        ctx = make_ctx(root)
        install = root / "home/kubernetes/bin/nvidia"
        for hard in (True, False):
            def fresh(hard: bool = hard) -> None:
                """Stage the version that is not current, after deleting its directory."""
                current = installed.current_name(install) or ""
                target = versions[1] if current.startswith(versions[0]) else versions[0]
                for old in (install / ".versions").glob(f"{target}-*"):
                    shutil.rmtree(old)
                stage.stage_package(ctx, packages[target], allow_hardlinks=hard)
            times = timed(fresh, reps)
            report(f"stage {size_mb:.0f} MB ({'hard links' if hard else 'copy + fsync'})",
                   times, f"{size_mb / (statistics.median(times) / 1000):.0f} MB/s")
        report("stage again (reused, switch only)",
               timed(lambda: stage.stage_package(ctx, packages[versions[0]]), reps))
        libcuda = next((install / "lib64").glob("libcuda.so.535.*"))
        soname = timed(lambda: read_soname(libcuda), reps * 20)
        print(f"{'read SONAME of libcuda (29 MB)':<44} median "
              f"{statistics.median(soname) * 1000:8.1f} us")
        built = build_standins(Path(tmp) / "standins")
        tree = standin_tree(Path(tmp) / "tree", built, versions[0])
        stage.stage_package(ctx, tree_package(tree, versions[0]))
        report("verify over the stand-ins (1 GPU, smoke)",
               timed(lambda: verify(ctx, cuda_smoke=True), reps))


if __name__ == "__main__":
    main()
