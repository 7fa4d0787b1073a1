"""Every benchmark in benchmarks/ still runs: each with `--quick` (small sizes, one pass; the
same code path as its full run), in a subprocess bounded by a timeout.

What is asserted is that it exits 0 and prints every figure it reports (a number where the
figure stands), never the figures' values: a quick run on a shared machine says nothing about
speed. Facts that are not timings (a repository byte-identical, no corrupt state after a
kill, grpcio not loaded) are asserted as the benchmarks themselves judge them. Temp files go
under the test's own directory (TMPDIR); bench_fetch keeps its generated package in the test
cache, as its full run does. Full runs and their figures: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fallbacknode import headers_debs

REPO = Path(__file__).resolve().parents[2]
NUM = r"-?\d+(?:\.\d+)?"


def _quick(name: str, tmp_path: Path, timeout: float) -> str:
    """Run benchmarks/<name>.py --quick; its stdout, once it exited 0."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{name}.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def _has(out: str, *patterns: str) -> None:
    """Every pattern (a regular expression, NUM for a number) matches a line of `out`."""
    for pattern in patterns:
        assert re.search(pattern, out, re.M), f"no {pattern!r} in:\n{out[-3000:]}"


def _json(out: str) -> dict[str, object]:
    """The JSON object a benchmark prints (lines from the first `{` to the last `}`)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    end = max(i for i, line in enumerate(lines) if line.startswith("}"))
    report: dict[str, object] = json.loads("\n".join(lines[start:end + 1]))
    return report


def _numbers(report: dict[str, object], *keys: str) -> None:
    for key in keys:
        assert isinstance(report.get(key), int | float), (key, report)


def _needs_compiler() -> None:
    """The build benchmarks compile against the kernel tier's cached real headers .debs."""
    if headers_debs() is None:
        pytest.skip("needs dpkg-deb and gcc-12 (the kernel's compiler) on this machine: "
                    "make deps")


def test_bench_install(tmp_path: Path) -> None:
    out = _quick("bench_install", tmp_path, 120)
    _has(out, r"^package: +8 MB", rf"^first install: +{NUM} s",
         rf"^baseline curl\|sha256sum\+cp -a: +{NUM} s +ratio {NUM}x",
         rf"^reboot fast path \(median of 1\): {NUM} s", rf"^container restart \(median of 1\): "
         rf"{NUM} s", rf"^peak RSS of install: +{NUM} MB", rf"import floor .*: {NUM} s")


def test_bench_cos_on_the_overlays_settings(tmp_path: Path) -> None:
    """The 8-GPU NVSwitch COS node installs as the gke-cos overlay configures it."""
    out = _quick("bench_cos", tmp_path, 180)
    _has(out, rf"^artifacts: +{NUM} MB", rf"^first install on COS: +{NUM} s \(peak RSS {NUM} MB",
         rf"^baseline curl\|md5sum \+ tar \+ sh --noexec: {NUM} s +ratio {NUM}x",
         rf"^reboot fast path, bucket gone \(median of 1\): {NUM} s")


def test_bench_fetch(tmp_path: Path) -> None:
    out = _quick("bench_fetch", tmp_path, 120)
    report = _json(out)
    assert report["reps"] == 1 and report["size_mb"] == pytest.approx(8.4, abs=0.1)
    for figures in ("seconds", "median_seconds", "mb_per_s"):
        values = report[figures]
        assert isinstance(values, dict)
        assert set(values) == {"fetch", "fetch_stage_only", "pipe", "file"}, figures
    _numbers(report, "ratio_vs_curl_pipe_sha256sum", "ratio_vs_curl_file_openssl",
             "stage_only_ratio_vs_pipe", "stage_only_ratio_vs_file", "fetch_peak_rss_mb")
    _has(out, r"^targets .*: (met|NOT met)")


def test_bench_stage(tmp_path: Path) -> None:
    out = _quick("bench_stage", tmp_path, 120)
    _has(out, rf"^stage {NUM} MB \(hard links\) +median +{NUM} ms .* n=1 {NUM} MB/s",
         rf"^stage {NUM} MB \(copy \+ fsync\) +median +{NUM} ms",
         rf"^stage again \(reused, switch only\) +median +{NUM} ms",
         rf"^read SONAME of libcuda .* median +{NUM} us",
         rf"^verify over the stand-ins .* median +{NUM} ms")


def test_cli_startup(tmp_path: Path) -> None:
    out = _quick("cli_startup", tmp_path, 120)
    _has(out, r"^1 runs each, load average")
    for command in ("python -c pass", "--help", "check-pod pod.yaml", "check-pod --help",
                    "compat --cuda --driver", "status --help"):
        _has(out, rf"^{re.escape(command)} +{NUM}ms +{NUM}ms +{NUM}ms")


def test_agent_idle(tmp_path: Path) -> None:
    out = _quick("agent_idle", tmp_path, 180)
    _has(out, r"^agent idle for 2 s .*still ready: True", rf"API calls in all: {NUM}",
         rf"^target: agent RSS <= {NUM} MB: (met|NOT met)")
    for process in ("agent", "python", "sleep"):
        _has(out, rf"^{process} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM} +{NUM}$")


def test_agent_metrics(tmp_path: Path) -> None:
    out = _quick("agent_metrics", tmp_path, 180)
    _has(out, rf"10 scrapes .*: p50 {NUM} ms, p99 {NUM} ms, max {NUM} ms",
         rf"^GPM off, same run: p50 {NUM} ms, p99 {NUM} ms, max {NUM} ms",
         rf"one 8-GPU pynvml pass, median {NUM} ms; grpcio loaded in the agent: False")
    for process in ("agent", "agent-gpm-off", "agent-metrics-off", "pynvml-loop"):
        _has(out, rf"^{process} +RSS max +{NUM} MB +PSS +{NUM} MB")


def test_killstorm(tmp_path: Path) -> None:
    """The repo and COS storms, 2 kills each; the on-node build's storm is
    tests/host/test_killstorm.py's (the same scene, every suite run)."""
    out = _quick("killstorm", tmp_path, 240)
    _has(out, r"^fallback: not run with --quick",
         rf"^package build --repo: 2 kills of a live run, instants over a {NUM} s run",
         rf"^cos assembly: 2 kills of a live run, instants over a {NUM} s run",
         r"^  landed in: ", r"^corrupt states in all: 0$")


def test_build_farm(tmp_path: Path) -> None:
    """Over the host tier's stand-in build trees (a real compile of its 6 builds is minutes;
    bench_build and bench_fallback below compile against the real headers)."""
    report = _json(_quick("build_farm", tmp_path, 180))
    assert report["tasks"] == 6 and report["shards"] == 3 and report["byte_identical"] is True
    shards = report["shard_s"]
    assert isinstance(shards, list) and len(shards) == 3, shards
    _numbers(report, "single_s", "shards_sum_s", "index_s", "slowest_over_mean",
             "sum_over_single", "per_build_s", "fleet_one_machine_s", "fleet_on_n_machines_s")


def test_bench_build(tmp_path: Path) -> None:
    """One kernel (the tier's cached real headers), the small NVIDIA-shaped sources."""
    _needs_compiler()
    report = _json(_quick("bench_build", tmp_path, 300))
    assert report["source"] == "mini" and report["identical_to_cached_build"] is None
    _numbers(report, "make_s", "build_s", "ratio", "target_ratio")


def test_bench_fallback(tmp_path: Path) -> None:
    """The on-node build on the cached real headers, the small NVIDIA-shaped sources."""
    _needs_compiler()
    out = _quick("bench_fallback", tmp_path, 300)
    _has(out, rf"^cold install with the on-node build: {NUM} s")
    report = _json(out)
    assert report["source"] == "mini"
    _numbers(report, "cold_install_s", "bare_make_s", "cold_overhead_s", "cold_ratio",
             "fast_path_median_s", "fast_path_min_s", "fast_path_max_s", "cold_peak_rss_mb")


def test_next_kernel(tmp_path: Path) -> None:
    """The scene's kernels, headers and mirror; its boots are the kernel tier's
    (tests/kernel/test_next_kernel.py boots the old kernel and the prepared new one)."""
    _needs_compiler()
    out = _quick("next_kernel", tmp_path, 300)
    _has(out, rf"^mirror for 6\.1\.0-56-amd64 \(\+ a source package\): {NUM} s",
         r"^boots: not run with --quick")


def test_every_benchmark_has_a_quick_run_here() -> None:
    """A new benchmark gets its quick run in this module, or it could rot unnoticed."""
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    benchmarks = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    covered = {b for b in benchmarks if any(t.startswith(b) for t in tested)}
    assert covered == benchmarks, sorted(benchmarks - covered)
