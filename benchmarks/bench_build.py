"""Benchmark: `package build --nvidia-source` against a bare `make` of the same sources.

    .venv/bin/python benchmarks/bench_build.py [--jobs 2] [--source real|mini]
    .venv/bin/python benchmarks/bench_build.py --matrix [--jobs 2] [--source real|mini]

Inputs are the real-kernel tier's (tests/kernel/assets.py, cached): bookworm's real
`nvidia-kernel-source` .deb (535.261.03) and Debian 6.1's real headers .debs, or with
`--source mini` tests/nvsources.py's small NVIDIA-shaped tree. In one run it times
  build  the real CLI end to end: unpack the source .deb and the three headers .debs, check,
         compile with -jN, hash and write the package (a fresh temp dir, no cache)
  make   `make -jN modules SYSSRC SYSOUT KERNEL_UNAME CC NV_KERNEL_MODULES` on the same
         module set, in an already unpacked copy of the sources against the tier's already
         unpacked headers (only the compile)
and prints both, their ratio (target: build <= 1.2x make), and whether the build's .ko files
are byte-identical to the cached package the kernel tests use (reproducibility, real 535).

`--matrix` times the many-kernel path instead: one `package build --repo` for 1 kernel
(6.1.0-57) and one for 3 bookworm kernels (6.1.0-57, -56, -55: nine headers .debs, the
shared linux-kbuild given once), both with the same `--jobs`, cold, and prints both wall
times and the scaling (3-kernel time / 1-kernel time; 3.0 = no gain from sharing the cores,
less = the serial parts of one build overlap another's compile).

`--quick` (the test suite runs it): one kernel with `--source mini` (the tier's cached
headers, without its kernel image; the small stand-in tree: seconds, not minutes); not with
`--matrix`, whose other two kernels' headers are not in the test cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from nvsources import mini_source  # noqa: E402

from tests.kernel import assets  # noqa: E402

CLI = (sys.executable, "-m", "installer")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--source", choices=("real", "mini"), default="real")
    parser.add_argument("--matrix", action="store_true",
                        help="1 kernel vs 3 kernels in one command (many-kernel builds)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    args = parser.parse_args()
    if args.quick:
        if args.matrix:
            parser.error("--quick is one kernel: not with --matrix")
        args.source = "mini"
    if args.matrix:
        matrix(args.jobs, args.source)
        return
    release = assets.kernel_release()
    # the compile needs only the headers; --quick leaves the kernel image (a download) out
    kernel = assets.ensure_headers(
        assets.Kernel(release, assets.cache_root() / "kernel" / release) if args.quick
        else assets.ensure_kernel(release))
    headers = assets.headers_debs(kernel)
    with tempfile.TemporaryDirectory(prefix="gni-bench-build-") as tmp:
        work = Path(tmp)
        if args.source == "real":
            source = assets.nvidia_source_deb()
            subprocess.run(["dpkg-deb", "-x", str(source), str(work / "deb")], check=True)
            subprocess.run(["tar", "-xJf", str(work / "deb/usr/src/nvidia-kernel.tar.xz"),
                            "-C", str(work)], check=True)
            tree = work / "modules" / "nvidia-kernel"
            modules = "nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem"
        else:
            source = tree = mini_source(work / "nvidia-src")
            modules = "nvidia nvidia-uvm nvidia-modeset nvidia-drm"
        bare = work / "bare"
        shutil.copytree(tree, bare, symlinks=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
        started = time.monotonic()
        subprocess.run(["make", "-C", str(bare), f"-j{args.jobs}", "modules",
                        f"SYSSRC={kernel.headers_common}", f"SYSOUT={kernel.headers}",
                        f"KERNEL_UNAME={kernel.release}", "CC=gcc-12",
                        f"NV_KERNEL_MODULES={modules}"], check=True, env=env,
                       capture_output=True)
        make_s = time.monotonic() - started
        out = work / "pkg"
        started = time.monotonic()
        subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                        *(f"--kernel-headers={h}" for h in headers), f"--jobs={args.jobs}",
                        f"--out-dir={out}"], check=True, capture_output=True)
        build_s = time.monotonic() - started
        same = None
        if args.source == "real":
            cached = assets.build_nvidia_cli(kernel) / "modules"
            same = all((cached / p.name).read_bytes() == p.read_bytes()
                       for p in (out / "modules").glob("*.ko"))
        print(json.dumps({"source": args.source, "jobs": args.jobs,
                          "make_s": round(make_s, 1), "build_s": round(build_s, 1),
                          "ratio": round(build_s / make_s, 3), "target_ratio": 1.2,
                          "identical_to_cached_build": same}, indent=1))


MATRIX_RELEASES = ("6.1.0-57-amd64", "6.1.0-56-amd64", "6.1.0-55-amd64")


def matrix(jobs: int, source_kind: str) -> None:
    """Wall time of `package build --repo` for 1 and for 3 kernels, and their ratio."""
    debs = {r: assets.release_headers_debs(r) for r in MATRIX_RELEASES}
    with tempfile.TemporaryDirectory(prefix="gni-bench-matrix-") as tmp:
        work = Path(tmp)
        source = (assets.nvidia_source_deb() if source_kind == "real"
                  else mini_source(work / "nvidia-src"))
        times = {}
        for count in (1, 3):
            unique = {d.name: d for r in MATRIX_RELEASES[:count] for d in debs[r]}
            started = time.monotonic()
            done = subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                                   *(f"--kernel-headers={d}" for d in unique.values()),
                                   f"--jobs={jobs}", f"--repo={work / f'repo{count}'}",
                                   "--output=json"], capture_output=True, text=True, check=False)
            times[count] = time.monotonic() - started
            if done.returncode != 0:
                sys.exit(f"{count} kernels: exit {done.returncode}: {done.stderr[-2000:]}")
            index = json.loads((work / f"repo{count}" / "index.json").read_text())
            assert len(index["packages"]) == count, index
        print(json.dumps({"source": source_kind, "jobs": jobs,
                          "kernels_1_s": round(times[1], 1), "kernels_3_s": round(times[3], 1),
                          "scaling_3_over_1": round(times[3] / times[1], 2),
                          "per_kernel_s_in_matrix": round(times[3] / 3, 1)}, indent=1))


if __name__ == "__main__":
    main()
