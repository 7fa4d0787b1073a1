#!/usr/bin/env python3
"""Benchmark: `install` with BUILD_FALLBACK=auto on a node whose kernel has no package.

    .venv/bin/python benchmarks/bench_fallback.py [--runs 5] [--source real|mini] [--quick]

A host tree (simulated kernel) running Debian's 6.1.0-57-amd64 with that kernel's real
headers under the host root (tests/fallbacknode.py); a file:// repository holding only a
source package: the NVML/CUDA stand-ins plus bookworm's real nvidia-kernel-source 535.261.03
(or `--source mini`, the small NVIDIA-shaped stand-in tree). In one run it times
  cold     the first `install`: fetch the source package, copy the node's build tree, compile
           the modules (make -j of the cores), sign/assemble/cache, load, stage, verify, signal
  reboot   the next boots (kernel state reset): the fast path from the cache, median of N
           (target <= 0.35 s)
  make     a bare `make modules` of the same sources against the same headers (baseline)
and prints them, with the cold install's overhead over the bare compile. `--quick` (the test
suite runs it): `--source mini` and one reboot run, the same node and real headers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bench_install import reboot, timed_install  # noqa: E402
from e2e import standin_env  # noqa: E402
from fallbacknode import RELEASE, headers_debs, make_node, unpack_headers  # noqa: E402
from native import build_standins  # noqa: E402
from native.packages import standin_tree  # noqa: E402
from nvsources import mini_source  # noqa: E402

from installer.packages.builder import BuildRequest, build  # noqa: E402
from tests.kernel import assets  # noqa: E402

VERSION = "535.261.03"


def bare_make(source: Path, work: Path, headers: Path, jobs: int, modules: str) -> float:
    """Seconds of `make modules` in an unpacked copy of the sources (only the compile)."""
    work.mkdir(parents=True)
    if source.is_dir():
        tree = source
    else:
        subprocess.run(["dpkg-deb", "-x", str(source), str(work / "deb")], check=True)
        subprocess.run(["tar", "-xJf", str(work / "deb/usr/src/nvidia-kernel.tar.xz"), "-C",
                        str(work)], check=True)
        tree = work / "modules" / "nvidia-kernel"
    bare = work / "bare"
    shutil.copytree(tree, bare, symlinks=True)
    src = headers / "usr/src"
    sysout = work / "sysout"
    shutil.copytree(src / f"linux-headers-{RELEASE}", sysout, symlinks=False)
    makefile = sysout / "Makefile"
    text = makefile.read_text()
    makefile.unlink()
    makefile.write_text(text.replace("include /usr/src/", f"include {src}/"))
    common = src / f"linux-headers-{RELEASE.rsplit('-', 1)[0]}-common"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    started = time.perf_counter()
    subprocess.run(["make", "-C", str(bare), f"-j{jobs}", "modules", f"SYSSRC={common}",
                    f"SYSOUT={sysout}", f"KERNEL_UNAME={RELEASE}", "CC=gcc-12",
                    f"NV_KERNEL_MODULES={modules}"], check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--source", choices=("real", "mini"), default="real")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    opts = parser.parse_args()
    if opts.quick:
        opts.source, opts.runs = "mini", 1
    debs = headers_debs()
    if debs is None:
        sys.exit(f"needs the kernel tier's cached linux-headers-{RELEASE} .debs (make "
                 "kernel-assets), dpkg-deb and gcc-12")
    jobs = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="gni-bench-fallback-") as tmp:
        work = Path(tmp)
        headers = unpack_headers(debs, work / "headers")
        source = (assets.nvidia_source_deb() if opts.source == "real"
                  else mini_source(work / "mini"))
        modules = "nvidia nvidia-uvm nvidia-modeset nvidia-drm" + (
            " nvidia-peermem" if opts.source == "real" else "")
        user = standin_tree(work / "user", build_standins(work / "built"), VERSION)
        build(BuildRequest(trees=(user,), nvidia_source=source, repo=work / "repo"))
        root = make_node(work / "node", headers)
        env = standin_env(VERSION)
        args = ["--host-root", str(root), "--proc-root", str(root / "proc"), "--sys-root",
                str(root / "sys"), "--log-format", "json", "--mirror",
                f"file://{work / 'repo'}", "--driver-version", VERSION,
                "--build-fallback", "auto"]
        cold, rss = timed_install(args, env)
        print(f"cold install with the on-node build: {cold:.1f} s", flush=True)
        reboots = []
        for _ in range(opts.runs):
            reboot(root / "proc")
            reboots.append(timed_install(args, env)[0])
        make_s = bare_make(source, work / "make", headers, jobs, modules)
    print(json.dumps({"source": opts.source, "jobs": jobs, "cold_install_s": round(cold, 1),
                      "bare_make_s": round(make_s, 1),
                      "cold_overhead_s": round(cold - make_s, 1),
                      "cold_ratio": round(cold / make_s, 3),
                      "fast_path_median_s": round(statistics.median(reboots), 3),
                      "fast_path_min_s": round(min(reboots), 3),
                      "fast_path_max_s": round(max(reboots), 3),
                      "fast_path_target_s": 0.35, "cold_peak_rss_mb": round(rss)}, indent=1))


if __name__ == "__main__":
    main()
