#!/usr/bin/env python3
"""Benchmarks for `install`, each against a baseline measured in the same run.

1. reboot fast path: state + cache hit, modules not loaded (the simulated kernel is reset
   as a reboot would), whole-process wall time, median of N runs (target <= 0.35 s);
2. container restart: driver already loaded, median of N runs (target <= 0.5 s);
3. first install of a >= 500 MB package from a 127.0.0.1 mirror, against
   `curl -s URL | sha256sum` of the package's big file plus `cp -a` of the package tree
   (target <= 1.0x that sum);
4. peak RSS of `install` (target <= 100 MB).

    .venv/bin/python benchmarks/bench_install.py [--size-mb 512] [--runs 10] [--quick]

`--quick` (the test suite runs it): an 8 MiB package, one run of each fast path.
"""

from __future__ import annotations

import argparse
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

from e2e import FAKENODE, add_version, make_scene, standin_env  # noqa: E402
from httpserver import MirrorServer  # noqa: E402

VERSION = "535.261.03"


def timed_install(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one `install` process (wait4: this child only)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(FAKENODE), "install", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"install failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, usage.ru_maxrss / 1024


def reboot(proc: Path) -> None:
    """What a reboot does to the simulated kernel: no module loaded any more."""
    (proc / ".fake-kernel.json").unlink(missing_ok=True)
    (proc / "modules").write_text("")


def baseline(url: str, big: Path, tree: Path, work: Path) -> float:
    start = time.perf_counter()
    subprocess.run(f"curl -s {url} | sha256sum >/dev/null", shell=True, check=True)
    subprocess.run(["cp", "-a", str(tree), str(work / "copy")], check=True)
    elapsed = time.perf_counter() - start
    shutil.rmtree(work / "copy")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    opts = parser.parse_args()
    if opts.quick:
        opts.size_mb, opts.runs = 8, 1
    with tempfile.TemporaryDirectory(prefix="gni-bench-") as tmp:
        scene = make_scene(Path(tmp))
        add_version(scene, VERSION, padding=opts.size_mb * 1024 * 1024)
        env = standin_env(VERSION)
        # the package directory, not the build lock (`.<flavour>.lock`) publishing keeps beside it
        tree = next(p for p in scene.repo.glob(f"*/{VERSION}/*") if p.is_dir())
        big = max(tree.rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0)
        with MirrorServer(scene.repo) as server:
            args = scene.args("--mirror", server.url, "--allow-http",
                              "--driver-version", VERSION)
            rel = big.relative_to(scene.repo)
            base = baseline(f"{server.url}/{rel}", big, tree, Path(tmp))
            first, rss_first = timed_install(args, env)
        offline = scene.args("--mirror", "http://127.0.0.1:9/", "--allow-http",
                             "--driver-version", VERSION)
        reboots, restarts, rss = [], [], [rss_first]
        for _ in range(opts.runs):
            reboot(scene.root / "proc")
            wall, peak = timed_install(offline, env)
            reboots.append(wall)
            rss.append(peak)
        for _ in range(opts.runs):
            wall, peak = timed_install(offline, env)
            restarts.append(wall)
            rss.append(peak)
    report(opts.size_mb, first, base, reboots, restarts, max(rss))


def report(size_mb: int, first: float, base: float, reboots: list[float],
           restarts: list[float], rss: float) -> None:
    reboot_med, restart_med = statistics.median(reboots), statistics.median(restarts)
    print(f"package:                      {size_mb} MB from 127.0.0.1")
    print(f"first install:                {first:.2f} s")
    print(f"baseline curl|sha256sum+cp -a: {base:.2f} s   ratio {first / base:.2f}x "
          f"(target <= 1.0x)")
    print(f"reboot fast path (median of {len(reboots)}): {reboot_med:.3f} s "
          f"(min {min(reboots):.3f}, max {max(reboots):.3f}; target <= 0.35 s)")
    print(f"container restart (median of {len(restarts)}): {restart_med:.3f} s "
          f"(min {min(restarts):.3f}, max {max(restarts):.3f}; target <= 0.5 s)")
    print(f"peak RSS of install:          {rss:.0f} MB (target <= 100 MB)")
    python_floor = subprocess.run(
        [sys.executable, "-c", "import time; t=time.perf_counter(); import click, requests, "
         "tenacity, structlog, pynvml; print(time.perf_counter()-t)"],
        capture_output=True, text=True, check=True).stdout.strip()
    print(f"(python import floor of the five dependencies here: {float(python_floor):.3f} s)")


def compile_bytecode() -> None:
    """Byte-compile the code under test, as a wheel install in the image does.

    Some shells set PYTHONDONTWRITEBYTECODE; without .pyc files every run would recompile
    the installer's modules (~70 ms) and the figures would not be the image's.
    """
    import compileall

    for path in (REPO / "installer", REPO / "tests"):
        compileall.compile_dir(str(path), quiet=1)


if __name__ == "__main__":
    compile_bytecode()
    main()
