#!/usr/bin/env python3
"""The COS source, each figure against a baseline measured in the same run.

1. first install on a COS node from Google's layout served on 127.0.0.1 over HTTPS (version
   files, the signed modules tarball, the makeself runfile from Debian's real 535 files,
   each checked against x-goog-hash, then assembled, cached, loaded, staged, verified),
   against `curl | md5sum` of the two big objects plus `tar -xzf` of the tarball and the
   runfile's own `--noexec --target` unpack (what cos_gpu_installer's path costs before it
   even runs nvidia-installer);
2. the reboot fast path on that node with the server gone, median of N whole processes
   (GKE's installer reloads and re-verifies through nvidia-smi on every boot).

The node is the gke-cos-a100x8 sample (8 A100s on NVSwitch), configured as the `gke-cos`
overlay configures the installer there: its settings (daemonset/overlays/gke-cos), among
them FABRIC_MANAGER=host (COS's artifacts carry no Fabric Manager; the node runs it), are
the run's environment, HOST_ROOT pointing at the node's tree.

    .venv/bin/python benchmarks/bench_cos.py [--runs 10] [--quick]

`--quick` (the test suite runs it): one reboot run; the same artifacts and code path.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

import yaml  # noqa: E402
from bench_install import compile_bytecode, reboot, timed_install  # noqa: E402
from cosbucket import cos_node, make_bucket  # noqa: E402
from cosserver import CosServer  # noqa: E402
from e2e import standin_env  # noqa: E402
from native import build_standins  # noqa: E402

from installer.testing import SAMPLE_NODES  # noqa: E402

VERSION = "535.261.03"
NODE = SAMPLE_NODES["gke-cos-a100x8"]
BUILD = "17800.218.20"
OVERLAY = REPO / "daemonset" / "overlays" / "gke-cos" / "kustomization.yaml"


def overlay_settings(host_root: Path) -> dict[str, str]:
    """The installer settings the gke-cos overlay merges into the DaemonSet's ConfigMap,
    with HOST_ROOT (where the pod mounts the node's /) pointing at this node's tree."""
    doc = yaml.safe_load(OVERLAY.read_text())
    (generator,) = (g for g in doc["configMapGenerator"]
                    if g["name"] == "gpu-node-installer-settings")
    settings = dict(literal.split("=", 1) for literal in generator["literals"])
    if settings.get("FABRIC_MANAGER") != "host":
        sys.exit(f"{OVERLAY} no longer sets FABRIC_MANAGER=host: update this benchmark")
    return {**settings, "HOST_ROOT": str(host_root)}


def baseline(server: CosServer, paths: list[str], tgz: Path, run: Path, work: Path) -> float:
    start = time.perf_counter()
    for path in paths:
        subprocess.run(f"curl -s --cacert {server.ca_bundle} {server.url}{path} | md5sum "
                       ">/dev/null", shell=True, check=True)
    (work / "tgz").mkdir(parents=True)
    subprocess.run(["tar", "--xattrs", "-xzf", str(tgz), "-C", str(work / "tgz")], check=True)
    subprocess.run(["sh", str(run), "--noexec", "--nox11", "--target", str(work / "run")],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="one reboot run (the test suite's check that it still runs)")
    opts = parser.parse_args()
    if opts.quick:
        opts.runs = 1
    with tempfile.TemporaryDirectory(prefix="gni-bench-cos-") as tmp:
        base = Path(tmp)
        bucket = make_bucket(base / "b", build_id=BUILD, kernel_release=NODE.kernel,
                             version=VERSION, standins=build_standins(base / "standins"))
        assert bucket.runfile is not None
        root = cos_node(base / "node")
        env = {**standin_env(VERSION, gpus=8), **overlay_settings(root)}
        ca = base / "ca.pem"
        with CosServer(bucket.root) as server:
            assert server.ca_bundle is not None
            ca.write_bytes(server.ca_bundle.read_bytes())
            args = ["--proc-root", str(root / "proc"),
                    "--sys-root", str(root / "sys"), "--cos-tools-url", server.cos_tools_url,
                    "--nvidia-runfile-url", server.runfile_url, "--ca-bundle", str(ca)]
            base_s = baseline(server, [bucket.tarball_path, bucket.runfile_path],
                              bucket.tarball, bucket.runfile, base / "baseline")
            first, rss = timed_install(args, env)
        reboots = []
        for _ in range(opts.runs):
            reboot(root / "proc")
            reboots.append(timed_install(args, env)[0])
        size = (bucket.tarball.stat().st_size + bucket.runfile.stat().st_size) / 1e6
    print(f"artifacts:                      {size:.0f} MB (modules tarball + runfile), HTTPS")
    print(f"first install on COS:           {first:.2f} s (peak RSS {rss:.0f} MB)")
    print(f"baseline curl|md5sum + tar + sh --noexec: {base_s:.2f} s   ratio "
          f"{first / base_s:.2f}x")
    print(f"reboot fast path, bucket gone (median of {len(reboots)}): "
          f"{statistics.median(reboots):.3f} s (min {min(reboots):.3f}, "
          f"max {max(reboots):.3f})")


if __name__ == "__main__":
    compile_bytecode()
    main()
