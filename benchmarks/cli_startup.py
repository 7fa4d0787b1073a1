"""Benchmark: the CLI's start-up as whole processes, against `python -c pass` in the same run.

    .venv/bin/python benchmarks/cli_startup.py [--runs 20] [--json] [--quick]

Each command is the installed console script (`.venv/bin/gpu-node-installer`), run `--runs`
times, the commands interleaved so that a load spike hits all of them alike; the floor is the
same virtualenv's `python -c pass` (interpreter start-up and site, with the editable install's
path hook). Reported per command: the median and the fastest wall time, and the median above
the floor (what the installer's own imports and work cost). The code is byte-compiled first,
as a wheel install in the image is.
Targets: `--help` <= 100 ms, `check-pod` on a small file <= 150 ms, `status` on a sample node
(`python -m installer.testing gke-ubuntu-t4`, written into a temp dir) <= the floor + 150 ms.
`--quick` (the test suite runs it): one run of each command after the warm-up.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POD = REPO / "tests" / "workloads" / "pod.yaml"
COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "python -c pass": ([str(BIN / "python"), "-c", "pass"], None),
    "--help": ([str(BIN / "gpu-node-installer"), "--help"], 0.100),
    "check-pod pod.yaml": ([str(BIN / "gpu-node-installer"), "check-pod", str(POD),
                            "--driver", "535.261.03"], 0.150),
    "check-pod --help": ([str(BIN / "gpu-node-installer"), "check-pod", "--help"], None),
    "compat --cuda --driver": ([str(BIN / "gpu-node-installer"), "compat", "--cuda", "12.4",
                                "--driver", "550.54.15"], None),
    "status --help": ([str(BIN / "gpu-node-installer"), "status", "--help"], None),
}
SAMPLE = Path(tempfile.mkdtemp(prefix="cli-startup-")) / "node"
COMMANDS["status (sample node)"] = ([
    str(BIN / "gpu-node-installer"), "status", "--host-root", str(SAMPLE),
    "--proc-root", str(SAMPLE / "proc"), "--sys-root", str(SAMPLE / "sys")], None)
ABOVE_FLOOR = {"status (sample node)": 0.150}  # targets relative to `python -c pass`


def once(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          check=False)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 14):
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}")
    return elapsed


def measure(runs: int) -> dict[str, list[float]]:
    compileall.compile_dir(REPO / "installer", quiet=1)
    subprocess.run([str(BIN / "python"), "-m", "installer.testing", "gke-ubuntu-t4",
                    str(SAMPLE)], check=True, stdout=subprocess.DEVNULL)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for argv, _target in COMMANDS.values():  # warm the page cache and the .pyc files
        once(argv)
    for _ in range(runs):
        for name, (argv, _target) in COMMANDS.items():
            times[name].append(once(argv))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one pass (the test suite runs this)")
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    times = measure(args.runs)
    floor = statistics.median(times["python -c pass"])
    rows = []
    for name, (_argv, target) in COMMANDS.items():
        median = statistics.median(times[name])
        target = floor + ABOVE_FLOOR[name] if name in ABOVE_FLOOR else target
        rows.append({"command": name, "median_s": round(median, 4),
                     "min_s": round(min(times[name]), 4),
                     "above_floor_s": round(median - floor, 4), "target_s": target,
                     "meets": None if target is None else median <= target})
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"runs": args.runs, "load": load, "rows": rows}, indent=2))
        return
    print(f"{args.runs} runs each, load average {load:.2f}")
    print(f"{'command':<24} {'median':>8} {'fastest':>8} {'above floor':>12}  target")
    for row in rows:
        target = "" if row["target_s"] is None else \
            f"<= {row['target_s'] * 1000:.0f} ms {'ok' if row['meets'] else 'MISSED'}"
        print(f"{row['command']:<24} {row['median_s'] * 1000:>6.0f}ms "
              f"{row['min_s'] * 1000:>6.0f}ms {row['above_floor_s'] * 1000:>10.0f}ms  {target}")


if __name__ == "__main__":
    main()
